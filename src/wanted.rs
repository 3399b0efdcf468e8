//! What the operator asked to cache (`--resources`, or `resources:` in the config file):
//! resource names (`pods`, `apps/deployments`, `example.com/widgets`, or as kubectl and
//! kube-apiserver's `--watch-cache-sizes` write them, `deployments.apps`), the wildcard `*` (every
//! resource the upstream serves itself that can be listed and watched, as the apiserver's own
//! watch cache covers), and exclusions (`-events`, `-events.k8s.io/events`), which only make
//! sense after a wildcard.
//!
//! Parsed by `config` (validation), read by `caches` (discovery, rediscovery) and `app`.

use std::collections::BTreeSet;

/// A parsed `--resources` list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// `*` was given: cache whatever discovery finds, less `excluded`.
    pub all: bool,
    /// Resources named one by one ("pods", "apps/deployments"): each must exist and be
    /// listable (a forbidden one stops the start); a wildcard resource that cannot be listed is
    /// skipped and reported instead.
    pub named: Vec<String>,
    /// `(group, resource)` pairs never cached.
    pub excluded: BTreeSet<(String, String)>,
}

/// Splits `"apps/deployments"` into `("apps", "deployments")`; `"pods"` is the core group,
/// and so is `"core/pods"` (as kubectl names it). `"deployments.apps"` is the same as
/// `"apps/deployments"` (kubectl's `resource.group`, kube-apiserver's `--watch-cache-sizes`):
/// no resource name has a dot, every non-core group has one.
pub fn group_resource(name: &str) -> Option<(&str, &str)> {
    let (group, resource) = match (name.split_once('/'), name.split_once('.')) {
        (Some((g, r)), _) => (g, r),
        (None, Some((r, g))) if !g.is_empty() => (g, r),
        (None, Some(_)) => return None,
        (None, None) => ("", name),
    };
    if resource.is_empty() || resource.contains('/') || (name.contains('/') && group.is_empty()) {
        return None;
    }
    Some((if group == "core" { "" } else { group }, resource))
}

impl Wanted {
    /// Parses the entries of `--resources` (already split on commas). Errors are one line,
    /// naming the flag.
    pub fn parse(entries: &[String]) -> Result<Wanted, String> {
        let mut w = Wanted::default();
        for raw in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            if raw == "*" {
                w.all = true;
            } else if let Some(ex) = raw.strip_prefix('-') {
                let (g, r) = group_resource(ex).ok_or_else(|| {
                    format!("--resources: {raw:?} is not `-resource`, `-group/resource` or `-resource.group`")
                })?;
                w.excluded.insert((g.to_owned(), r.to_owned()));
            } else {
                group_resource(raw).ok_or_else(|| {
                    format!("--resources: {raw:?} is not `*`, `resource`, `group/resource`, `resource.group` or an exclusion `-group/resource`")
                })?;
                if !w.named.iter().any(|n| n == raw) {
                    w.named.push(raw.to_owned());
                }
            }
        }
        if !w.all && !w.excluded.is_empty() {
            return Err(
                "--resources: exclusions (`-name`) need the wildcard `*` before them, e.g. `*,-events`"
                    .into(),
            );
        }
        if !w.all && w.named.is_empty() {
            return Err(
                "no resources to cache: give --resources (e.g. --resources pods,configmaps, or '*,-events') or --config"
                    .into(),
            );
        }
        if let Some(n) =
            w.named.iter().find(|n| group_resource(n).is_some_and(|gr| w.is_excluded(gr.0, gr.1)))
        {
            return Err(format!("--resources: {n:?} is both named and excluded"));
        }
        Ok(w)
    }

    pub fn is_excluded(&self, group: &str, resource: &str) -> bool {
        self.excluded.contains(&(group.to_owned(), resource.to_owned()))
    }

    /// Whether `(group, resource)` is named explicitly.
    pub fn names(&self, group: &str, resource: &str) -> bool {
        self.named.iter().any(|n| group_resource(n) == Some((group, resource)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Wanted, String> {
        Wanted::parse(&s.split(',').map(str::to_owned).collect::<Vec<_>>())
    }

    #[test]
    fn names_wildcard_and_exclusions() {
        let w = p("pods, apps/deployments").unwrap();
        assert!(!w.all);
        assert_eq!(w.named, ["pods", "apps/deployments"]);
        let w = p("*,-events,-events.k8s.io/events").unwrap();
        assert!(w.all && w.named.is_empty());
        assert!(w.is_excluded("", "events") && w.is_excluded("events.k8s.io", "events"));
        assert!(!w.is_excluded("", "pods"));
        let w = p("*,-core/events,pods").unwrap();
        assert!(w.is_excluded("", "events") && w.names("", "pods"));
        // kubectl's `resource.group`.
        let w = p("deployments.apps,widgets.example.com").unwrap();
        assert!(w.names("apps", "deployments") && w.names("example.com", "widgets"));
        let w = p("*,-events.events.k8s.io,-leases.coordination.k8s.io").unwrap();
        assert!(w.is_excluded("events.k8s.io", "events") && w.is_excluded("coordination.k8s.io", "leases"));
        assert_eq!(
            group_resource("validatingwebhookconfigurations.admissionregistration.k8s.io"),
            Some(("admissionregistration.k8s.io", "validatingwebhookconfigurations"))
        );
        assert!(p("pods.").is_err() && p(".apps").is_err());
    }

    #[test]
    fn refuses_what_cannot_mean_anything() {
        assert!(p("").unwrap_err().contains("no resources"));
        assert!(p("-events").unwrap_err().contains("need the wildcard"));
        assert!(p("*,-").is_err());
        assert!(p("a/b/c").is_err());
        assert!(p("/pods").is_err());
        assert!(p("*,pods,-pods").unwrap_err().contains("both named and excluded"));
    }
}
