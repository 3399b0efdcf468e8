//! One LIST page from the upstream, with the items kept as the exact bytes received.
//!
//! Called by `reflector` (initial list and relists, page by page, or whole from an RV after
//! its watch expired) and by
//! `server::consistent` (the initial state of a watch-list that the cache cannot yet prove
//! fresh, with the watch's own namespace and selectors). The body is buffered once;
//! each item is a zero-copy slice of it (`Bytes::slice_ref` of a borrowed `RawValue`), so the
//! cache stores the upstream's own encoding without a decode/encode round trip.

use std::borrow::Cow;
use std::collections::HashSet;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{Upstream, UpstreamError};
use crate::resource::{ResourceKind, Rv};

/// One page of a LIST.
#[derive(Debug)]
pub struct ListPage {
    /// The list's `metadata.resourceVersion`.
    pub rv: Rv,
    /// `metadata.continue`, `None` on the last page.
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`: how many items the pages after this one hold (an
    /// estimate; the apiserver gives it for paged lists without selectors).
    pub remaining: Option<u64>,
    /// Each item's JSON exactly as received.
    pub items: Vec<Bytes>,
    /// The answer's `Warning` header values ([`Upstream::list_page`]'s; a deprecated API's).
    pub warnings: Vec<String>,
}

#[derive(Deserialize)]
struct RawList<'a> {
    #[serde(borrow, default)]
    metadata: Option<RawListMeta<'a>>,
    #[serde(borrow, default)]
    items: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct RawListMeta<'a> {
    #[serde(borrow, default, rename = "resourceVersion")]
    resource_version: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "continue")]
    continue_token: Option<Cow<'a, str>>,
    /// Read leniently: only an estimate, never a reason to refuse a list.
    #[serde(borrow, default, rename = "remainingItemCount")]
    remaining: Option<&'a RawValue>,
}

impl ListPage {
    /// Parses a list body; items are slices of `body`.
    pub fn parse(body: &Bytes) -> Result<ListPage, UpstreamError> {
        let raw: RawList<'_> =
            serde_json::from_slice(body).map_err(|e| UpstreamError::Decode(format!("list body: {e}")))?;
        let meta = raw.metadata.ok_or_else(|| UpstreamError::Decode("list has no metadata".into()))?;
        let rv = match meta.resource_version.as_deref() {
            Some(s) if !s.is_empty() => {
                Rv::parse(s).map_err(|e| UpstreamError::Decode(format!("list metadata.{e}")))?
            }
            _ => return Err(UpstreamError::Decode("list has no metadata.resourceVersion".into())),
        };
        let items =
            raw.items.unwrap_or_default().into_iter().map(|item| body.slice_ref(item.get().as_bytes()));
        Ok(ListPage {
            rv,
            continue_token: meta.continue_token.filter(|c| !c.is_empty()).map(Cow::into_owned),
            remaining: meta.remaining.and_then(|n| serde_json::from_str(n.get()).ok()),
            items: items.collect(),
            warnings: Vec::new(),
        })
    }
}

/// `?limit=<limit>[&continue=<c>][&resourceVersion=<rv>]`, values percent-encoded.
pub(crate) fn list_query(limit: u32, continue_token: Option<&str>, rv: Option<Rv>) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("limit", &limit.to_string());
    if let Some(c) = continue_token {
        q.append_pair("continue", c);
    }
    if let Some(rv) = rv {
        q.append_pair("resourceVersion", &rv.to_string());
    }
    q.finish()
}

/// What a LIST selects: a namespace (of a namespaced resource) and raw selectors.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selection {
    pub namespace: Option<String>,
    pub label_selector: String,
    pub field_selector: String,
}

/// `?[limit=<limit>][&continue=<c>][&labelSelector=…][&fieldSelector=…]`: a consistent
/// (resourceVersion unset) page of a selection (all of it without a limit).
pub(crate) fn selected_query(limit: Option<u32>, continue_token: Option<&str>, sel: &Selection) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    if let Some(l) = limit {
        q.append_pair("limit", &l.to_string());
    }
    if let Some(c) = continue_token {
        q.append_pair("continue", c);
    }
    if !sel.label_selector.is_empty() {
        q.append_pair("labelSelector", &sel.label_selector);
    }
    if !sel.field_selector.is_empty() {
        q.append_pair("fieldSelector", &sel.field_selector);
    }
    q.finish()
}

/// The pages of one paginated list, each checked against those before it
/// ([`Pages::check`]): by the reflector's full list and the consistency check's.
#[derive(Default)]
pub struct Pages {
    first: Option<Rv>,
    tokens: std::collections::HashSet<String>,
}

impl Pages {
    /// A page at `rv` continued by `token`: at the first page's RV (a continue token carries
    /// its list's RV), and with a token the list did not give before. An upstream (or a front
    /// proxy) that repeats one would have the list read for ever — the reflector's holding its
    /// items until memory ran out (found by a review; [`Upstream::list_metadata_from`] had
    /// its own guard).
    pub fn check(&mut self, rv: Rv, token: Option<&str>) -> Result<(), UpstreamError> {
        let first = *self.first.get_or_insert(rv);
        if rv != first {
            return Err(UpstreamError::Decode(format!(
                "a continued list page is at resourceVersion {rv}, its first page at {first}"
            )));
        }
        match token {
            Some(t) if !t.is_empty() && !self.tokens.insert(t.to_owned()) => {
                Err(UpstreamError::Decode("the upstream gave a list's continue token twice".into()))
            }
            _ => Ok(()),
        }
    }
}

/// A consistent LIST page of a selection as `PartialObjectMetadataList`: what the upstream had
/// (keys and resourceVersions) without the objects' bodies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataPage {
    pub rv: Rv,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
    /// (namespace, name, resourceVersion) of each item, in the upstream's order.
    pub items: Vec<(String, String, Rv)>,
}

#[derive(Deserialize)]
struct RawMetaList<'a> {
    #[serde(borrow, default)]
    metadata: Option<RawMetaListMeta<'a>>,
    #[serde(borrow, default)]
    items: Option<Vec<RawMetaItem<'a>>>,
}

#[derive(Deserialize)]
struct RawMetaListMeta<'a> {
    #[serde(borrow, default, rename = "resourceVersion")]
    resource_version: Option<Cow<'a, str>>,
    #[serde(borrow, default, rename = "continue")]
    continue_token: Option<Cow<'a, str>>,
    #[serde(default, rename = "remainingItemCount")]
    remaining: Option<u64>,
}

#[derive(Deserialize)]
struct RawMetaItem<'a> {
    #[serde(borrow)]
    metadata: RawItemMeta<'a>,
}

#[derive(Deserialize)]
struct RawItemMeta<'a> {
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, rename = "resourceVersion")]
    resource_version: Cow<'a, str>,
}

impl MetadataPage {
    pub fn parse(body: &[u8]) -> Result<MetadataPage, UpstreamError> {
        let raw: RawMetaList<'_> =
            serde_json::from_slice(body).map_err(|e| UpstreamError::Decode(format!("metadata list: {e}")))?;
        let meta =
            raw.metadata.ok_or_else(|| UpstreamError::Decode("metadata list has no metadata".into()))?;
        let rv = Rv::parse(meta.resource_version.as_deref().unwrap_or(""))
            .map_err(|e| UpstreamError::Decode(format!("metadata list: {e}")))?;
        let mut items = Vec::new();
        for i in raw.items.unwrap_or_default() {
            let irv = Rv::parse(&i.metadata.resource_version)
                .map_err(|e| UpstreamError::Decode(format!("metadata list item: {e}")))?;
            items.push((
                i.metadata.namespace.unwrap_or_default().into_owned(),
                i.metadata.name.into_owned(),
                irv,
            ));
        }
        Ok(MetadataPage {
            rv,
            continue_token: meta.continue_token.filter(|c| !c.is_empty()).map(Cow::into_owned),
            remaining: meta.remaining,
            items,
        })
    }
}

/// The `Accept` of a metadata-only list.
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

/// Items per upstream page of [`Upstream::list_metadata`]: a proof of a whole large
/// collection holds one page of JSON at a time, not the collection's.
const METADATA_PAGE: u32 = 500;

impl Upstream {
    /// A consistent LIST of a selection, metadata only: its first `limit` items (all of them
    /// without a limit, or with `limit=0`, which the apiserver takes as none), read in pages of
    /// [`METADATA_PAGE`] — the first a consistent read at the upstream's current revision, the
    /// others by their continue tokens at that same revision — and given as one page: the
    /// first page's RV, every item, and the last page's continuation (where the upstream would
    /// have ended a page of `limit` items).
    pub async fn list_metadata(
        &self,
        kind: &ResourceKind,
        sel: &Selection,
        limit: Option<u32>,
    ) -> Result<MetadataPage, UpstreamError> {
        self.list_metadata_from(kind, sel, limit, None).await
    }

    /// [`Upstream::list_metadata`] going on from `first`, what an earlier call of it gave (its
    /// items kept, the rest read by its continue token at its RV).
    pub async fn list_metadata_from(
        &self,
        kind: &ResourceKind,
        sel: &Selection,
        limit: Option<u32>,
        first: Option<MetadataPage>,
    ) -> Result<MetadataPage, UpstreamError> {
        let path = kind.collection_path(sel.namespace.as_deref());
        let limit = limit.filter(|&l| l > 0);
        let mut seen: HashSet<String> = first.iter().filter_map(|p| p.continue_token.clone()).collect();
        let mut out: Option<MetadataPage> = match first {
            Some(f) if f.continue_token.as_deref().is_none_or(str::is_empty) => return Ok(f),
            first => first,
        };
        loop {
            let fetched = out.as_ref().map_or(0, |p| p.items.len());
            let want = limit.map_or(METADATA_PAGE, |l| (l - fetched as u32).min(METADATA_PAGE));
            let token = out.as_ref().and_then(|p| p.continue_token.as_deref());
            let q = selected_query(Some(want), token, sel);
            let page =
                MetadataPage::parse(&self.inner.get_bytes_as(&format!("{path}?{q}"), METADATA_LIST).await?)?;
            let all = match out.take() {
                None => page,
                // A continue token carries its list's RV: a page at another RV is not of this
                // list (an upstream that does not keep it), and no proof.
                Some(all) if page.rv != all.rv => {
                    return Err(UpstreamError::Decode(format!(
                        "a continued metadata list page is at resourceVersion {}, its first page at {}",
                        page.rv, all.rv
                    )))
                }
                Some(mut all) => {
                    all.items.extend(page.items);
                    all.continue_token = page.continue_token;
                    all.remaining = page.remaining;
                    all
                }
            };
            let full = limit.is_some_and(|l| all.items.len() >= l as usize);
            // An upstream that ignores `limit` answers everything at once, without a token; one
            // that gives a token it gave before would never end: its page is taken as it is
            // (the proof then fails on the continuation and the read is forwarded).
            match &all.continue_token {
                Some(t) if !full && seen.insert(t.clone()) => out = Some(all),
                _ => return Ok(all),
            }
        }
    }

    /// One page of a metadata-only LIST of everything at exactly `rv` (first page:
    /// `resourceVersion=<rv>&resourceVersionMatch=Exact`; later pages: the continue token,
    /// which carries the RV). For the consistency check (`consistency`).
    pub async fn list_metadata_exact(
        &self,
        kind: &ResourceKind,
        rv: Rv,
        limit: u32,
        continue_token: Option<&str>,
    ) -> Result<MetadataPage, UpstreamError> {
        let query = {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("limit", &limit.to_string());
            match continue_token {
                Some(c) => {
                    q.append_pair("continue", c);
                }
                None => {
                    q.append_pair("resourceVersion", &rv.to_string());
                    q.append_pair("resourceVersionMatch", "Exact");
                }
            }
            q.finish()
        };
        let path = format!("{}?{query}", kind.collection_path(None));
        let body = self.inner.get_bytes_as(&path, METADATA_LIST).await?;
        MetadataPage::parse(&body)
    }

    /// The whole state at least as new as `rv`, with the proxy's own credentials:
    /// `GET <collection>?resourceVersion=<rv>`, no limit — client-go's relist after its watch
    /// expired, which an apiserver serves from its watch cache (a paginated list, and before
    /// 1.31 a consistent one, is read from etcd). Its body is admitted as it arrives
    /// (`Inner::get_bytes_admitted`); `Ok(None)` when `admit` refused more of it.
    pub async fn list_since(
        &self,
        kind: &ResourceKind,
        rv: Rv,
        admit: &mut (dyn FnMut(u64) -> bool + Send),
    ) -> Result<Option<ListPage>, UpstreamError> {
        let path = format!("{}?resourceVersion={rv}", kind.collection_path(None));
        let Some((body, warnings)) = self.inner.get_bytes_admitted(&path, admit).await? else {
            return Ok(None);
        };
        Ok(Some(ListPage { warnings, ..ListPage::parse(&body)? }))
    }

    /// One LIST page with the proxy's own credentials:
    /// `GET <collection>?limit=<limit>[&continue=<c>][&resourceVersion=<rv>]`.
    pub async fn list_page(
        &self,
        kind: &ResourceKind,
        limit: u32,
        continue_token: Option<&str>,
        rv: Option<Rv>,
    ) -> Result<ListPage, UpstreamError> {
        let path = format!("{}?{}", kind.collection_path(None), list_query(limit, continue_token, rv));
        let (body, warnings) = self.inner.get_bytes_warned(&path).await?;
        Ok(ListPage { warnings, ..ListPage::parse(&body)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first page of the `list-pagination-3-pages` recording, with its exact byte layout.
    const PAGE: &str = concat!(
        r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"198","#,
        r#""continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTk4LCJzdGFydCI6ImNtLTJcdTAwMDAifQ","#,
        r#""remainingItemCount":3},"items":[{"metadata":{"name":"cm-1","namespace":"cap-base","#,
        r#""resourceVersion":"198","labels":{"app":"a","tier":"front"}},"data":{"k":"v1-updated"}},"#,
        r#" {"metadata":{"name":"cm-2","namespace":"cap-base","resourceVersion":"194","#,
        r#""annotations":{"note":"caf\u00e9 \"quoted\" \\ back"}},"data":{"k":"v2"}}]}"#,
        "\n"
    );

    #[test]
    fn items_are_byte_identical_slices_of_the_body() {
        let body = Bytes::from_static(PAGE.as_bytes());
        let page = ListPage::parse(&body).unwrap();
        assert_eq!(page.rv, Rv(198));
        assert_eq!(
            page.continue_token.as_deref(),
            Some("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTk4LCJzdGFydCI6ImNtLTJcdTAwMDAifQ")
        );
        assert_eq!(page.items.len(), 2);
        assert_eq!(page.remaining, Some(3));
        assert_eq!(
            &page.items[0][..],
            br#"{"metadata":{"name":"cm-1","namespace":"cap-base","resourceVersion":"198","labels":{"app":"a","tier":"front"}},"data":{"k":"v1-updated"}}"#
        );
        // Escapes are kept as sent, not decoded and re-encoded.
        assert!(page.items[1].ends_with(br#""note":"caf\u00e9 \"quoted\" \\ back"}},"data":{"k":"v2"}}"#));
        // Zero-copy: the item points into the body's buffer.
        let start = page.items[0].as_ptr() as usize - body.as_ptr() as usize;
        assert_eq!(&PAGE.as_bytes()[start..start + page.items[0].len()], &page.items[0][..]);
    }

    #[test]
    fn last_page_and_empty_or_null_items() {
        let last = ListPage::parse(&Bytes::from_static(
            br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":""},"items":[]}"#,
        ))
        .unwrap();
        assert_eq!((last.rv, last.continue_token, last.items.len(), last.remaining), (Rv(7), None, 0, None));
        let null =
            ListPage::parse(&Bytes::from_static(br#"{"metadata":{"resourceVersion":"8"},"items":null}"#))
                .unwrap();
        assert!(null.items.is_empty());
    }

    /// `remainingItemCount` is an estimate: one that is not a count leaves it unknown and the
    /// page as good as any.
    #[test]
    fn an_odd_remaining_item_count_is_unknown_not_an_error() {
        for odd in ["-2", "1.5", "\"3\"", "null", "{}"] {
            let body = format!(
                r#"{{"metadata":{{"resourceVersion":"9","remainingItemCount":{odd}}},"items":[{{"a":1}}]}}"#
            );
            let page = ListPage::parse(&Bytes::from(body)).unwrap();
            assert_eq!((page.rv, page.remaining, page.items.len()), (Rv(9), None, 1), "{odd}");
        }
    }

    #[test]
    fn malformed_lists_are_decode_errors() {
        for body in [
            &b"not json"[..],
            br#"{"items":[]}"#,
            br#"{"metadata":{},"items":[]}"#,
            br#"{"metadata":{"resourceVersion":"x1"},"items":[]}"#,
            br#"{"metadata":{"resourceVersion":"1"},"items":[{"a":1},"#,
        ] {
            let e = ListPage::parse(&Bytes::copy_from_slice(body)).unwrap_err();
            assert!(matches!(e, UpstreamError::Decode(_)), "{e}");
        }
    }

    #[test]
    fn metadata_lists_give_keys_and_rvs() {
        let body = br#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"12","continue":"tok","remainingItemCount":3},"items":[{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"a","namespace":"ns","resourceVersion":"7","labels":{"x":"y"}}},{"metadata":{"name":"n1","resourceVersion":"9"}}]}"#;
        let p = MetadataPage::parse(body).unwrap();
        assert_eq!(p.rv, Rv(12));
        assert_eq!(p.continue_token.as_deref(), Some("tok"));
        assert_eq!(p.remaining, Some(3));
        assert_eq!(p.items, [("ns".into(), "a".into(), Rv(7)), (String::new(), "n1".into(), Rv(9))]);
        for bad in [
            &br#"{"items":[]}"#[..],
            br#"{"metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"a"}}]}"#,
        ] {
            assert!(MetadataPage::parse(bad).is_err());
        }
    }

    #[test]
    fn query_is_percent_encoded_in_order() {
        assert_eq!(list_query(500, None, None), "limit=500");
        assert_eq!(
            list_query(2, Some("eyJ2Ijoi+/="), Some(Rv(198))),
            "limit=2&continue=eyJ2Ijoi%2B%2F%3D&resourceVersion=198"
        );
        let sel = Selection {
            namespace: Some("ns".into()),
            label_selector: "app in (a,b)".into(),
            field_selector: "metadata.name=x".into(),
        };
        assert_eq!(
            selected_query(Some(500), Some("tok"), &sel),
            "limit=500&continue=tok&labelSelector=app+in+%28a%2Cb%29&fieldSelector=metadata.name%3Dx"
        );
        assert_eq!(selected_query(Some(500), None, &Selection::default()), "limit=500");
        assert_eq!(selected_query(None, None, &Selection::default()), "");
    }
}
