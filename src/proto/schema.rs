//! The Kubernetes protobuf schema: every message of k8s.io/api, apimachinery's meta/v1,
//! runtime, resource and intstr, apiextensions and apiregistration, with what gogo's generated
//! Marshal needs to know per field (number, JSON member name, type, whether Go writes it always
//! or only when set, JSON-inline). The table, `schema.txt`, is generated from the Go sources
//! by `tools/protoschema.py`, which checks it against each `generated.proto` and
//! `generated.pb.go`.
//!
//! Parsed once, at the first protobuf request (`schema()`). Read by `proto::transcode`.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The generated table.
const TABLE: &str = include_str!("schema.txt");

/// A scalar protobuf type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalar {
    String,
    Bytes,
    Bool,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Double,
    Float,
}

/// A field's type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ty {
    Scalar(Scalar),
    /// Index into [`Schema::messages`].
    Message(usize),
    /// Key (always a scalar in Kubernetes) and value.
    Map(Scalar, Box<Ty>),
}

/// When Go's generated code writes a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Card {
    /// A non-pointer Go field: always, its zero value included.
    One,
    /// A pointer (or a `[]byte`): only when set.
    Opt,
    /// A slice: once per element.
    Rep,
    /// A map: once per entry, keys in ascending order.
    Map,
}

/// Messages whose Go type has a hand-written Marshal or a custom JSON form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// meta/v1 Time: RFC 3339 seconds ⇄ Timestamp{seconds, nanos: 0}; zero → empty.
    Time,
    /// meta/v1 MicroTime: microseconds ⇄ Timestamp{seconds, nanos}; zero → empty.
    MicroTime,
    /// meta/v1 Duration: Go duration text ⇄ nanoseconds.
    Duration,
    /// resource.Quantity: its canonical string.
    Quantity,
    /// intstr.IntOrString: a JSON number or string.
    IntOrString,
    /// meta/v1 FieldsV1 (made by the apiserver), apiextensions JSON (normalised by it): the
    /// JSON bytes themselves.
    RawJson,
    /// apiextensions JSONSchemaPropsOrArray: a schema object or an array of them.
    SchemaOrArray,
    /// apiextensions JSONSchemaPropsOrBool: a boolean or a schema object.
    SchemaOrBool,
    /// apiextensions JSONSchemaPropsOrStringArray: a schema object or an array of strings.
    SchemaOrStringArray,
    /// Anything else marked special: not transcoded (the request goes upstream).
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Field {
    pub number: u32,
    /// The JSON member name (`$ref`, `x-kubernetes-…` included).
    pub json: String,
    pub ty: Ty,
    pub card: Card,
    /// The JSON has the nested message's members inline in this object.
    pub inline: bool,
    /// The Kubernetes minor version whose types first have the field (0: 1.28 or older): an
    /// older apiserver does not write it, not even as a zero value.
    pub since: u32,
    /// A `[]byte` whose JSON member Go leaves out both when nil and when empty, where its
    /// protobuf differs (nothing against an empty field): an object without it cannot be
    /// encoded exactly.
    pub omitempty: bool,
}

#[derive(Clone, Debug)]
pub struct Message {
    /// Full name, e.g. `k8s.io.api.core.v1.Pod`.
    pub name: String,
    pub special: Option<Special>,
    /// A named Go slice (`ExtraValue []string`): a JSON array that is the message's field 1.
    pub array: bool,
    /// In ascending field number order (the order gogo writes them in).
    pub fields: Vec<Field>,
}

#[derive(Debug, Default)]
pub struct Schema {
    pub messages: Vec<Message>,
    by_name: HashMap<String, usize>,
    /// (group, version) → proto package; the core group is `""`.
    packages: HashMap<(String, String), String>,
}

/// The schema of the built-in table, parsed at first use.
pub fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| match Schema::parse(TABLE) {
        Ok(s) => s,
        Err(e) => {
            // The table is generated and tested (`the_table_parses`): this cannot happen in
            // a build that passed its tests. Serve no protobuf rather than panic.
            tracing::error!(error = %e, "the protobuf schema table does not parse; protobuf requests go upstream");
            Schema::default()
        }
    })
}

fn special(name: &str) -> Special {
    let short = name.rsplit('.').next().unwrap_or(name);
    let meta = name.starts_with("k8s.io.apimachinery.pkg.apis.meta.v1.");
    match short {
        "Time" if meta => Special::Time,
        "MicroTime" if meta => Special::MicroTime,
        "Duration" if meta => Special::Duration,
        "FieldsV1" if meta => Special::RawJson,
        // QuantityValue embeds Quantity and its Marshal.
        "Quantity" | "QuantityValue" if name.starts_with("k8s.io.apimachinery.pkg.api.resource.") => {
            Special::Quantity
        }
        "IntOrString" if name.starts_with("k8s.io.apimachinery.pkg.util.intstr.") => Special::IntOrString,
        // Its bytes are what the writer sent (any spacing, unescaped `<`): the JSON the cache
        // holds is their compaction, which cannot prove them (recorded: a ControllerRevision
        // written with spaces). Such objects go upstream in protobuf.
        "RawExtension" if name.starts_with("k8s.io.apimachinery.pkg.runtime.") => Special::Unknown,
        "JSON" if name.contains("apiextensions") => Special::RawJson,
        "JSONSchemaPropsOrArray" => Special::SchemaOrArray,
        "JSONSchemaPropsOrBool" => Special::SchemaOrBool,
        "JSONSchemaPropsOrStringArray" => Special::SchemaOrStringArray,
        _ => Special::Unknown,
    }
}

fn scalar(word: &str) -> Option<Scalar> {
    Some(match word {
        "string" => Scalar::String,
        "bytes" => Scalar::Bytes,
        "bool" => Scalar::Bool,
        "int32" => Scalar::Int32,
        "int64" => Scalar::Int64,
        "uint32" => Scalar::Uint32,
        "uint64" => Scalar::Uint64,
        "double" => Scalar::Double,
        "float" => Scalar::Float,
        _ => return None,
    })
}

/// A field type before message names are resolved to indices.
enum RawTy {
    Scalar(Scalar),
    Message(String),
    Map(Scalar, Box<RawTy>),
}

/// A field line before message names are resolved: number, JSON name, type, card, inline,
/// since, omitempty.
type RawField = (u32, String, RawTy, Card, bool, u32, bool);

fn raw_ty(word: &str) -> Result<RawTy, String> {
    if let Some(inner) = word.strip_prefix("map<").and_then(|w| w.strip_suffix('>')) {
        let (k, v) = inner.split_once(',').ok_or_else(|| format!("bad map type {word}"))?;
        let k = scalar(k).ok_or_else(|| format!("map key {k} is not a scalar"))?;
        return Ok(RawTy::Map(k, Box::new(raw_ty(v)?)));
    }
    Ok(match scalar(word) {
        Some(s) => RawTy::Scalar(s),
        None => RawTy::Message(word.to_owned()),
    })
}

impl Schema {
    /// Parses the table format `tools/protoschema.py` writes.
    pub fn parse(text: &str) -> Result<Schema, String> {
        let mut s = Schema::default();
        let mut raw_fields: Vec<Vec<RawField>> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let w: Vec<&str> = line.split_ascii_whitespace().collect();
            let bad = || format!("schema line {}: {line}", n + 1);
            match w[0] {
                "g" if w.len() == 4 => {
                    let group = if w[1] == "core" { "" } else { w[1] };
                    s.packages.insert((group.to_owned(), w[2].to_owned()), w[3].to_owned());
                }
                "m" if w.len() >= 2 => {
                    let name = w[1].to_owned();
                    let flags = &w[2..];
                    let special = flags.contains(&"special").then(|| special(&name));
                    s.by_name.insert(name.clone(), s.messages.len());
                    s.messages.push(Message {
                        name,
                        special,
                        array: flags.contains(&"array"),
                        fields: Vec::new(),
                    });
                    raw_fields.push(Vec::new());
                }
                "f" if w.len() >= 5 => {
                    let number: u32 = w[1].parse().map_err(|_| bad())?;
                    let ty = raw_ty(w[3]).map_err(|e| format!("{}: {e}", bad()))?;
                    let card = match w[4] {
                        "one" => Card::One,
                        "opt" => Card::Opt,
                        "rep" => Card::Rep,
                        "map" => Card::Map,
                        _ => return Err(bad()),
                    };
                    let inline = w[5..].contains(&"inline");
                    let omitempty = w[5..].contains(&"omitempty");
                    let since = match w[5..].iter().find_map(|t| t.strip_prefix("since=")) {
                        Some(n) => n.parse().map_err(|_| bad())?,
                        None => 0,
                    };
                    raw_fields.last_mut().ok_or_else(bad)?.push((
                        number,
                        w[2].to_owned(),
                        ty,
                        card,
                        inline,
                        since,
                        omitempty,
                    ));
                }
                _ => return Err(bad()),
            }
        }
        for (i, fields) in raw_fields.into_iter().enumerate() {
            let mut out = Vec::with_capacity(fields.len());
            for (number, json, ty, card, inline, since, omitempty) in fields {
                let ty = s.resolve(ty).map_err(|e| format!("{}.{json}: {e}", s.messages[i].name))?;
                if inline && !matches!(ty, Ty::Message(_)) {
                    return Err(format!("{}.{json}: inline but not a message", s.messages[i].name));
                }
                if omitempty && ty != Ty::Scalar(Scalar::Bytes) {
                    return Err(format!("{}.{json}: omitempty but not bytes", s.messages[i].name));
                }
                out.push(Field { number, json, ty, card, inline, since, omitempty });
            }
            out.sort_by_key(|f| f.number);
            s.messages[i].fields = out;
        }
        Ok(s)
    }

    fn resolve(&self, t: RawTy) -> Result<Ty, String> {
        Ok(match t {
            RawTy::Scalar(s) => Ty::Scalar(s),
            RawTy::Message(name) => {
                Ty::Message(self.message(&name).ok_or_else(|| format!("unknown message {name}"))?)
            }
            RawTy::Map(k, v) => Ty::Map(k, Box::new(self.resolve(*v)?)),
        })
    }

    /// A message by full name.
    pub fn message(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The message of a kind (`("apps", "v1", "Deployment")`), if the kind has one.
    pub fn kind(&self, group: &str, version: &str, kind: &str) -> Option<usize> {
        let package = self.packages.get(&(group.to_owned(), version.to_owned()))?;
        self.message(&format!("{package}.{kind}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_parses_and_knows_the_cached_kinds() {
        let s = Schema::parse(TABLE).expect("schema.txt parses");
        for (g, v, k) in [
            ("", "v1", "Pod"),
            ("", "v1", "ConfigMap"),
            ("", "v1", "Secret"),
            ("", "v1", "Node"),
            ("apps", "v1", "Deployment"),
            ("batch", "v1", "Job"),
            ("discovery.k8s.io", "v1", "EndpointSlice"),
            ("coordination.k8s.io", "v1", "Lease"),
            ("networking.k8s.io", "v1", "NetworkPolicy"),
            ("policy", "v1", "PodDisruptionBudget"),
            ("rbac.authorization.k8s.io", "v1", "ClusterRole"),
            ("storage.k8s.io", "v1", "StorageClass"),
            ("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            ("apiregistration.k8s.io", "v1", "APIService"),
        ] {
            assert!(s.kind(g, v, k).is_some(), "{g}/{v} {k}");
        }
        let status = &s.messages[s.message("k8s.io.api.core.v1.PodStatus").unwrap()];
        let observed = status.fields.iter().find(|f| f.json == "observedGeneration").unwrap();
        assert_eq!(observed.since, 33, "PodStatus.observedGeneration is 1.33's");
        let pod = &s.messages[s.kind("", "v1", "Pod").unwrap()];
        let numbers: Vec<u32> = pod.fields.iter().map(|f| f.number).collect();
        assert_eq!(numbers, [1, 2, 3]);
        assert_eq!(pod.fields[0].json, "metadata");
        assert_eq!(pod.fields[0].card, Card::One);
        let meta = &s.messages[s.message("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta").unwrap()];
        let dgps = meta.fields.iter().find(|f| f.json == "deletionGracePeriodSeconds").unwrap();
        assert_eq!((dgps.number, dgps.card), (10, Card::Opt));
        let time = &s.messages[s.message("k8s.io.apimachinery.pkg.apis.meta.v1.Time").unwrap()];
        assert_eq!(time.special, Some(Special::Time));
        // Every message marked special is one the transcoder knows, but for discovery's
        // GroupVersion string and runtime.Unknown (no cached object holds them) and
        // RawExtension (deliberately: see `special`).
        for m in &s.messages {
            let exempt = m.name.ends_with("meta.v1.GroupVersion")
                || m.name == "k8s.io.apimachinery.pkg.runtime.Unknown"
                || m.name == "k8s.io.apimachinery.pkg.runtime.RawExtension";
            assert!(m.special != Some(Special::Unknown) || exempt, "{} is special and unknown", m.name);
        }
        let volume = &s.messages
            [s.kind("", "v1", "Pod").map(|_| s.message("k8s.io.api.core.v1.Volume").unwrap()).unwrap()];
        assert!(volume.fields.iter().any(|f| f.inline), "VolumeSource is inline in JSON");
    }

    #[test]
    fn bad_lines_are_errors() {
        assert!(Schema::parse("m a.B\nf x name string one").is_err());
        assert!(Schema::parse("m a.B\nf 1 name a.C one").is_err());
        assert!(Schema::parse("m a.B\nf 1 name string sometimes").is_err());
        let s = Schema::parse("g core v1 p\nm p.A\nf 2 b string one since=33\nf 1 a map<string,p.A> map")
            .unwrap();
        let a = &s.messages[s.kind("", "v1", "A").unwrap()];
        assert_eq!(a.fields[0].json, "a");
        assert_eq!(a.fields[0].ty, Ty::Map(Scalar::String, Box::new(Ty::Message(0))));
        assert_eq!((a.fields[0].since, a.fields[1].since), (0, 33));
    }
}
