//! Table tests for `classify`: every row names the API rule it checks.

use super::*;

fn kinds() -> Vec<Arc<ResourceKind>> {
    vec![
        Arc::new(ResourceKind::new("", "v1", "pods", "Pod", true, true)),
        Arc::new(ResourceKind::new("", "v1", "configmaps", "ConfigMap", true, true)),
        Arc::new(ResourceKind::new("", "v1", "nodes", "Node", false, true)),
        Arc::new(ResourceKind::new("", "v1", "namespaces", "Namespace", false, true)),
        Arc::new(ResourceKind::new("apps", "v1", "deployments", "Deployment", true, true)),
        Arc::new(ResourceKind::new("example.com", "v1", "widgets", "Widget", true, false)),
    ]
}

fn route(method: Method, path: &str, query: &str, accept: Option<&str>) -> Route {
    let k = kinds();
    classify(&method, path, Some(query), accept, &k[..])
}

fn plan(path: &str, query: &str) -> Plan {
    match route(Method::GET, path, query, None) {
        Route::Cache(c) => c.plan,
        other => panic!("{path}?{query}: expected the cache, got {other:?}"),
    }
}

fn forward(path: &str, query: &str) -> ForwardReason {
    match route(Method::GET, path, query, None) {
        Route::Forward(r) => r,
        other => panic!("{path}?{query}: expected forward, got {other:?}"),
    }
}

fn reject(path: &str, query: &str) -> (u16, String) {
    match route(Method::GET, path, query, None) {
        Route::Reject(e) => (e.to_status().code.as_u16(), e.to_string()),
        other => panic!("{path}?{query}: expected an error, got {other:?}"),
    }
}

const CMS: &str = "/api/v1/namespaces/ns/configmaps";

#[test]
fn paths() {
    let p = parse_path("/api/v1/namespaces/ns/pods/p1/log").unwrap();
    assert_eq!(
        (p.namespace.as_deref(), p.resource.as_str(), p.name.as_deref()),
        (Some("ns"), "pods", Some("p1"))
    );
    assert_eq!(p.subresource.as_deref(), Some("log"));
    let p = parse_path("/apis/apps/v1/watch/namespaces/ns/deployments/d").unwrap();
    assert!(p.watch_prefix);
    assert_eq!((p.group.as_str(), p.name.as_deref()), ("apps", Some("d")));
    let p = parse_path("/api/v1/namespaces/ns").unwrap();
    assert_eq!((p.resource.as_str(), p.name.as_deref(), p.namespace), ("namespaces", Some("ns"), None));
    let p = parse_path("/api/v1/namespaces/ns/status").unwrap();
    assert_eq!((p.resource.as_str(), p.subresource.as_deref()), ("namespaces", Some("status")));
    assert!(parse_path("/version").is_none());
    assert!(parse_path("/apis/apps/v1").is_none());
    assert!(parse_path("/api/v1//pods").is_none());
}

#[test]
fn what_goes_upstream() {
    // Writes and non-GETs.
    assert!(matches!(route(Method::POST, CMS, "", None), Route::Forward(ForwardReason::Write)));
    assert!(matches!(
        route(Method::DELETE, &format!("{CMS}/a"), "", None),
        Route::Forward(ForwardReason::Write)
    ));
    // Discovery and other non-resource paths.
    assert_eq!(forward("/api", ""), ForwardReason::NonResource);
    assert_eq!(forward("/openapi/v3", ""), ForwardReason::NonResource);
    // Not cached: events, secrets.
    assert_eq!(forward("/api/v1/events", "resourceVersion=0"), ForwardReason::NotCached);
    // Subresources.
    assert_eq!(forward("/api/v1/namespaces/ns/pods/p/log", "follow=true"), ForwardReason::Subresource);
    assert_eq!(forward("/api/v1/namespaces/ns/pods/p/exec", ""), ForwardReason::Subresource);
    // GET with RV unset reads etcd.
    assert_eq!(forward(&format!("{CMS}/a"), ""), ForwardReason::MostRecentGet);
    // A field selector on a custom resource that the proxy does not know.
    assert_eq!(
        forward("/apis/example.com/v1/widgets", "fieldSelector=spec.size%3D1"),
        ForwardReason::UnknownField
    );
}

/// A selector heavier than any client's (thousands of `!aN` terms fit in the URL limit, each
/// checked against each object's labels on a worker every request shares) goes upstream; one
/// at the limit is served from the cache, however its weight is made up.
#[test]
fn selectors_heavier_than_the_limit_are_forwarded() {
    let terms = |n: usize| (0..n).map(|i| format!("!a{i}")).collect::<Vec<_>>().join(",");
    let values =
        |n: usize| format!("a in ({})", (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>().join(","));
    let q = |labels: &str, fields: &str| {
        let mut s = form_urlencoded::Serializer::new(String::new());
        s.append_pair("resourceVersion", "0").append_pair("labelSelector", labels);
        if !fields.is_empty() {
            s.append_pair("fieldSelector", fields);
        }
        s.finish()
    };
    let at_limit = [
        q(&terms(MAX_SELECTOR_WEIGHT), ""),
        q(&values(MAX_SELECTOR_WEIGHT), ""),
        q(&terms(MAX_SELECTOR_WEIGHT - 1), "metadata.name=x"),
    ];
    for query in &at_limit {
        assert!(matches!(route(Method::GET, CMS, query, None), Route::Cache(_)), "{query}");
    }
    let over = [
        q(&terms(MAX_SELECTOR_WEIGHT + 1), ""),
        q(&values(MAX_SELECTOR_WEIGHT + 1), ""),
        q(&terms(MAX_SELECTOR_WEIGHT), "metadata.name=x"),
        q(&terms(5000), ""),
    ];
    for query in &over {
        assert_eq!(forward(CMS, query), ForwardReason::LargeSelector, "{}", &query[..60]);
    }
    // Watches too (their selector runs on every event).
    assert_eq!(forward(CMS, &format!("watch=1&{}", q(&terms(200), ""))), ForwardReason::LargeSelector);
}

#[test]
fn content_negotiation() {
    let accept = |a: &str| route(Method::GET, CMS, "resourceVersion=0", Some(a));
    // kubelet and controllers: protobuf first, JSON or */* also accepted → cache.
    assert!(matches!(accept("application/vnd.kubernetes.protobuf,application/json"), Route::Cache(_)));
    assert!(matches!(accept("application/vnd.kubernetes.protobuf, */*"), Route::Cache(_)));
    assert!(matches!(accept("application/json"), Route::Cache(_)));
    // Protobuf only → cache, in protobuf; Table first (kubectl) → upstream.
    assert!(matches!(accept("application/vnd.kubernetes.protobuf"), Route::Cache(_)));
    assert!(matches!(
        accept("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"),
        Route::Forward(ForwardReason::Accept)
    ));
    assert!(matches!(accept("text/html"), Route::Forward(ForwardReason::Accept)));
    // Metadata-only informers (issue 17): JSON metadata from the cache, in the verb's form.
    let meta_list = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let meta = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let repr = |r: Route| match r {
        Route::Cache(c) => Some(c.repr),
        _ => None,
    };
    assert_eq!(repr(accept(meta_list)), Some(Repr::MetadataProto));
    assert_eq!(repr(accept("application/json")), Some(Repr::Full));
    assert_eq!(repr(accept("application/vnd.kubernetes.protobuf,application/json")), Some(Repr::FullProto));
    assert_eq!(
        repr(route(Method::GET, &format!("{CMS}/a"), "resourceVersion=0", Some(meta))),
        Some(Repr::Metadata)
    );
    assert_eq!(repr(route(Method::GET, CMS, "watch=1&resourceVersion=0", Some(meta))), Some(Repr::Metadata));
    // The apiserver's own answers: 406 for a list asked as one object, objects for a watch
    // asked as a list.
    assert!(matches!(accept(meta), Route::Forward(ForwardReason::Accept)));
    assert!(matches!(
        route(Method::GET, CMS, "watch=1&resourceVersion=0", Some(meta_list)),
        Route::Forward(ForwardReason::Accept)
    ));
    // Custom resources too (their metadata re-ordered as ObjectMeta), in protobuf; their
    // whole objects only in JSON.
    let widgets = |a: &str| route(Method::GET, "/apis/example.com/v1/widgets", "resourceVersion=0", Some(a));
    assert_eq!(repr(widgets(meta_list)), Some(Repr::MetadataProto));
    assert_eq!(repr(widgets("application/vnd.kubernetes.protobuf, application/json")), Some(Repr::Full));
    assert!(matches!(widgets("application/vnd.kubernetes.protobuf"), Route::Forward(ForwardReason::Accept)));
}

#[test]
fn get_plans() {
    // GetOptions: only resourceVersion counts; `?watch=1` on an object URL is a plain GET.
    assert_eq!(plan(&format!("{CMS}/a"), "resourceVersion=0"), Plan::Get { min_rv: None });
    assert_eq!(plan(&format!("{CMS}/a"), "resourceVersion=7"), Plan::Get { min_rv: Some(Rv(7)) });
    assert_eq!(plan(&format!("{CMS}/a"), "watch=1&resourceVersion=7"), Plan::Get { min_rv: Some(Rv(7)) });
    assert_eq!(
        plan(&format!("{CMS}/a"), "resourceVersion=0&resourceVersionMatch=Bogus"),
        Plan::Get { min_rv: None }
    );
    // Parameters GetOptions does not have are not decoded (no 400 for a bad limit), and
    // `export=true` is refused (recorded from kube-apiserver 1.28.7, `GetResource` in 1.36).
    let get = format!("{CMS}/a");
    assert_eq!(plan(&get, "resourceVersion=0&limit=abc&timeoutSeconds=x"), Plan::Get { min_rv: None });
    assert_eq!(plan(&get, "resourceVersion=0&fieldSelector=foo"), Plan::Get { min_rv: None });
    assert_eq!(plan(&get, "resourceVersion=0&export=false"), Plan::Get { min_rv: None });
    for q in [
        "resourceVersion=0&export=1",
        "export=&resourceVersion=0",
        "resourceVersion=0&export=false&export=true",
    ] {
        let expected = if q.contains("export=false") { None } else { Some(400) };
        match route(Method::GET, &get, q, None) {
            Route::Reject(e) => {
                assert_eq!(Some(e.to_status().code.as_u16()), expected, "{q}");
                assert_eq!(
                    e.to_string(),
                    "the export parameter, deprecated since v1.14, is no longer supported"
                );
            }
            other => assert!(expected.is_none(), "{q}: {other:?}"),
        }
    }
    // Non-numeric RV on GET: the cacher's raw 500.
    let (code, msg) = reject(&format!("{CMS}/a"), "resourceVersion=abc");
    assert_eq!(code, 500);
    assert_eq!(
        msg,
        r#"resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax"#
    );
}

#[test]
fn list_plans() {
    // Any: limit ignored.
    assert_eq!(plan(CMS, "resourceVersion=0&limit=1"), Plan::ListAny);
    assert_eq!(plan(CMS, "resourceVersion=0&resourceVersionMatch=NotOlderThan"), Plan::ListAny);
    // Another spelling of zero: 1.36 compares the text, so the limit holds.
    assert_eq!(plan(CMS, "resourceVersion=00"), Plan::ListAny);
    assert_eq!(plan(CMS, "resourceVersion=00&limit=1"), Plan::ListMostRecent { limit: Some(1), start: None });
    assert_eq!(
        plan(CMS, "resourceVersion=00&resourceVersionMatch=Exact"),
        Plan::ListMostRecent { limit: None, start: None }
    );
    assert_eq!(
        plan(CMS, "resourceVersion=00&resourceVersionMatch=NotOlderThan&limit=1"),
        Plan::ListNotOlderThan { min_rv: Rv(0), limit: Some(1) }
    );
    // NotOlderThan.
    assert_eq!(plan(CMS, "resourceVersion=5"), Plan::ListNotOlderThan { min_rv: Rv(5), limit: None });
    assert_eq!(
        plan(CMS, "resourceVersion=5&resourceVersionMatch=NotOlderThan&limit=2"),
        Plan::ListNotOlderThan { min_rv: Rv(5), limit: Some(2) }
    );
    // Exact and legacy exact (limit + N).
    assert_eq!(
        plan(CMS, "resourceVersion=5&resourceVersionMatch=Exact"),
        Plan::ListExact { rv: Rv(5), limit: None, start: None }
    );
    assert_eq!(
        plan(CMS, "resourceVersion=5&limit=2"),
        Plan::ListExact { rv: Rv(5), limit: Some(2), start: None }
    );
    // Most Recent.
    assert_eq!(plan(CMS, ""), Plan::ListMostRecent { limit: None, start: None });
    assert_eq!(plan(CMS, "limit=500"), Plan::ListMostRecent { limit: Some(500), start: None });
    // Continue tokens pin the RV; rv -1 continues at the latest state.
    let t = ContinueToken::after(198, "cm-2").encode();
    assert_eq!(
        plan(CMS, &format!("limit=2&continue={t}")),
        Plan::ListExact { rv: Rv(198), limit: Some(2), start: Some("cm-2\u{0}".into()) }
    );
    let t = ContinueToken::after(-1, "cm-2").encode();
    assert_eq!(
        plan(CMS, &format!("continue={t}&resourceVersion=0")),
        Plan::ListMostRecent { limit: None, start: Some("cm-2\u{0}".into()) }
    );
}

#[test]
fn list_errors_in_the_apiserver_order() {
    // Non-numeric RV on LIST: 400 (1.36).
    let (code, msg) = reject(CMS, "resourceVersion=abc");
    assert_eq!(code, 400);
    assert!(msg.starts_with("invalid resource version: resourceVersion: Invalid value: \"abc\""), "{msg}");
    // A refused continue token, or a refused value with characters Go quotes otherwise, is the
    // apiserver's to refuse (its decoders read tokens more leniently: a review): forwarded.
    let t = ContinueToken::after(198, "cm-2").encode();
    for q in [
        format!("continue={t}&resourceVersionMatch=NotOlderThan&resourceVersion=5"),
        format!("continue={t}&resourceVersion=5"),
        "continue=abc!".into(),
        // The apiserver's token with its last character's unused bits set: Go serves the page.
        "continue=eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6NSwic3RhcnQiOiJhXHUwMDAwIn1".into(),
        "limit=%07".into(),
        "resourceVersion=%C2%A0".into(),
        "limit=%FF".into(),
    ] {
        assert_eq!(forward(CMS, &q), ForwardReason::UnusualQuery, "{q}");
    }
    assert_eq!(reject(CMS, "limit=x").1, r#"strconv.ParseInt: parsing "x": invalid syntax"#);
    assert_eq!(plan(CMS, &format!("continue={t}")), plan(CMS, &format!("continue={t}&limit=0")));
    // Field labels: per-resource wording.
    assert_eq!(
        reject("/api/v1/pods", "fieldSelector=spec.foo%3Dbar"),
        (400, "field label not supported: spec.foo".into())
    );
    assert_eq!(
        reject("/api/v1/configmaps", "fieldSelector=data.x%3D1"),
        (400, r#""data.x" is not a known field selector: only "metadata.name", "metadata.namespace""#.into())
    );
    // A watch of one object: a field selector must require exactly its name (recorded from
    // kube-apiserver 1.28.7: `metadata.namespace=…` or `metadata.name!=…` alone is refused).
    let one = "/api/v1/watch/namespaces/ns/configmaps/cm-1";
    for q in [
        "fieldSelector=metadata.name%3Dcm-2",
        "fieldSelector=metadata.namespace%3Dns",
        "fieldSelector=metadata.name!%3Dcm-1",
        "fieldSelector=metadata.name!%3Dcm-2",
    ] {
        assert_eq!(
            reject(one, q),
            (400, "fieldSelector metadata.name doesn't match requested name".into()),
            "{q}"
        );
    }
    for q in [
        "fieldSelector=",
        "fieldSelector=metadata.namespace%3Dns,metadata.name%3Dcm-1",
        "fieldSelector=metadata.name%3D%3Dcm-1",
    ] {
        assert!(matches!(route(Method::GET, one, q, None), Route::Cache(_)), "{q}");
    }
    // Integers first, `timeoutSeconds` before `limit` whatever the order, Go's texts.
    assert_eq!(reject(CMS, "limit=x"), (400, r#"strconv.ParseInt: parsing "x": invalid syntax"#.into()));
    assert_eq!(reject(CMS, "limit="), (400, r#"strconv.ParseInt: parsing "": invalid syntax"#.into()));
    assert_eq!(
        reject(CMS, "limit=99999999999999999999"),
        (400, r#"strconv.ParseInt: parsing "99999999999999999999": value out of range"#.into())
    );
    assert_eq!(reject(CMS, "limit=x&timeoutSeconds=y").1, r#"strconv.ParseInt: parsing "y": invalid syntax"#);
    assert_eq!(
        reject(CMS, "labelSelector=a%20b%20c&limit=x").1,
        r#"strconv.ParseInt: parsing "x": invalid syntax"#
    );
    // Then the label selector, then the field selector's syntax, before validation's 422; a
    // field the resource does not select is the registry's 400, after it.
    assert_eq!(
        reject(CMS, "fieldSelector=foo&labelSelector=a%20b%20c").1,
        "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
    );
    assert_eq!(
        reject(CMS, "fieldSelector=foo&resourceVersionMatch=Exact"),
        (400, "invalid selector: 'foo'; can't understand 'foo'".into())
    );
    assert_eq!(reject("/api/v1/configmaps", "fieldSelector=nope%3D1&resourceVersionMatch=Exact").0, 422);
}

#[test]
fn watch_plans() {
    // Legacy watch from N.
    assert_eq!(plan(CMS, "watch=1&resourceVersion=5"), Plan::WatchAfter { rv: Rv(5) });
    assert_eq!(plan(CMS, "watch=&resourceVersion=5"), Plan::WatchAfter { rv: Rv(5) });
    assert_eq!(
        plan("/api/v1/watch/namespaces/ns/configmaps", "resourceVersion=5"),
        Plan::WatchAfter { rv: Rv(5) }
    );
    // 1.34+ defaulting: RV 0 / unset become watch-lists.
    assert_eq!(plan(CMS, "watch=1&resourceVersion=0"), Plan::WatchList { min_rv: None });
    assert_eq!(plan(CMS, "watch=1"), Plan::WatchMostRecent { initial: true });
    // Explicit watch-list.
    assert_eq!(
        plan(CMS, "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=9"),
        Plan::WatchList { min_rv: Some(Rv(9)) }
    );
    assert_eq!(
        plan(CMS, "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0"),
        Plan::WatchNow
    );
    assert_eq!(
        plan(CMS, "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=9"),
        Plan::WatchAfter { rv: Rv(9) }
    );
    // Watches ignore limit and continue, even a malformed one.
    assert_eq!(plan(CMS, "watch=1&resourceVersion=5&limit=1&continue=abc!"), Plan::WatchAfter { rv: Rv(5) });
    // `watch=false` on a /watch/ path is still a watch, but defaulted and validated as the
    // query says (1.36 `get.go`: `listOpts`, then `forceWatch`): a legacy watch, never a
    // watch-list, and a list's 422s (a review).
    let prefix = "/api/v1/watch/namespaces/ns/configmaps";
    assert_eq!(plan(prefix, "resourceVersion=0&watch=false"), Plan::WatchState);
    assert_eq!(plan(prefix, "allowWatchBookmarks=true"), Plan::WatchState);
    assert_eq!(plan(prefix, "resourceVersion=5&resourceVersionMatch=Exact"), Plan::WatchAfter { rv: Rv(5) });
    let Route::Reject(e) =
        route(Method::GET, prefix, "sendInitialEvents=true&resourceVersionMatch=NotOlderThan", None)
    else {
        panic!("a 422")
    };
    assert_eq!(
        (
            e.to_status().code.as_u16(),
            serde_json::from_slice::<serde_json::Value>(&e.to_status().body).unwrap()["message"]
                .as_str()
                .unwrap()
                .to_owned()
        ),
        (
            422,
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: resourceVersionMatch is \
             forbidden unless resourceVersion is provided, sendInitialEvents: Forbidden: sendInitialEvents is \
             forbidden for list]"
                .into()
        )
    );
    // Only the texts "" and "0" are defaulted: `00` is a legacy watch from the current state.
    assert_eq!(plan(CMS, "watch=1&resourceVersion=00&allowWatchBookmarks=true"), Plan::WatchState);
    assert_eq!(plan(CMS, "watch=1&allowWatchBookmarks=true"), Plan::WatchMostRecent { initial: true });
    // Non-numeric RV on WATCH: 500.
    assert_eq!(reject(CMS, "watch=1&resourceVersion=abc").0, 500);
    // 422s.
    assert_eq!(reject(CMS, "watch=1&sendInitialEvents=true").0, 422);
}

/// (method, path, query) → (verb, group, namespace, resource, subresource, name), each row
/// checked against `RequestInfoFactory.NewRequestInfo` (k8s.io/apiserver
/// pkg/endpoints/request/requestinfo.go).
#[test]
fn request_info_is_the_apiservers() {
    type Row = (&'static str, &'static str, &'static str, [&'static str; 6]);
    let rows: &[Row] = &[
        // Namespaced collections and objects.
        ("GET", CMS, "", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "resourceVersion=0&limit=5", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "watch=1", ["watch", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "watch=", ["watch", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "watch=yes", ["watch", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "watch=False", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "watch=0&watch=1", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", "/api/v1/namespaces/ns/configmaps/a", "", ["get", "", "ns", "configmaps", "", "a"]),
        // `?watch=1` on an object URL is still a get.
        ("GET", "/api/v1/namespaces/ns/configmaps/a", "watch=1", ["get", "", "ns", "configmaps", "", "a"]),
        // All namespaces, cluster-scoped resources.
        ("GET", "/api/v1/configmaps", "", ["list", "", "", "configmaps", "", ""]),
        ("GET", "/api/v1/nodes", "watch=true", ["watch", "", "", "nodes", "", ""]),
        ("GET", "/api/v1/nodes/n1", "", ["get", "", "", "nodes", "", "n1"]),
        (
            "GET",
            "/apis/apps/v1/namespaces/ns/deployments/d",
            "",
            ["get", "apps", "ns", "deployments", "", "d"],
        ),
        // The namespaces resource: a namespace addressed by name is about itself.
        ("GET", "/api/v1/namespaces/X", "resourceVersion=0", ["get", "", "X", "namespaces", "", "X"]),
        ("GET", "/api/v1/namespaces/X/status", "", ["get", "", "X", "namespaces", "status", "X"]),
        ("PUT", "/api/v1/namespaces/X/finalize", "", ["update", "", "X", "namespaces", "finalize", "X"]),
        ("GET", "/api/v1/namespaces", "", ["list", "", "", "namespaces", "", ""]),
        (
            "GET",
            "/api/v1/namespaces",
            "fieldSelector=metadata.name%3DX",
            ["list", "", "", "namespaces", "", "X"],
        ),
        ("GET", "/api/v1/watch/namespaces/X", "", ["watch", "", "X", "namespaces", "", "X"]),
        // metadata.name field selectors name the object of a list or watch…
        ("GET", CMS, "fieldSelector=metadata.name%3Da", ["list", "", "ns", "configmaps", "", "a"]),
        (
            "GET",
            CMS,
            "watch=1&fieldSelector=metadata.name%3D%3Da",
            ["watch", "", "ns", "configmaps", "", "a"],
        ),
        (
            "GET",
            CMS,
            "fieldSelector=metadata.namespace%3Dns,metadata.name%3Da",
            ["list", "", "ns", "configmaps", "", "a"],
        ),
        // … unless not an exact match, not a valid path segment, or the query does not decode.
        ("GET", CMS, "fieldSelector=metadata.name!%3Da", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "fieldSelector=metadata.name%3D..", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "fieldSelector=metadata.name%3Da%25b", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "fieldSelector=metadata.name%3Da&limit=x", ["list", "", "ns", "configmaps", "", ""]),
        (
            "GET",
            CMS,
            "fieldSelector=metadata.name%3Da&labelSelector=%3D%3D",
            ["list", "", "ns", "configmaps", "", ""],
        ),
        ("GET", CMS, "fieldSelector=metadata.name%3Da,bogus", ["list", "", "ns", "configmaps", "", ""]),
        ("GET", CMS, "fieldSelector=metadata.name%3Da%5C,b", ["list", "", "ns", "configmaps", "", "a,b"]),
        // The legacy /watch/ prefix sets the verb before any name could come from a selector.
        (
            "GET",
            "/api/v1/watch/namespaces/ns/configmaps",
            "fieldSelector=metadata.name%3Da",
            ["watch", "", "ns", "configmaps", "", ""],
        ),
        ("GET", "/api/v1/watch/namespaces/ns/configmaps/a", "", ["watch", "", "ns", "configmaps", "", "a"]),
        ("GET", "/apis/apps/v1/watch/deployments", "", ["watch", "apps", "", "deployments", "", ""]),
        // Writes and subresources.
        ("POST", CMS, "", ["create", "", "ns", "configmaps", "", ""]),
        ("DELETE", CMS, "", ["deletecollection", "", "ns", "configmaps", "", ""]),
        ("DELETE", "/api/v1/namespaces/ns/configmaps/a", "", ["delete", "", "ns", "configmaps", "", "a"]),
        ("PATCH", "/api/v1/namespaces/ns/pods/p/status", "", ["patch", "", "ns", "pods", "status", "p"]),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", "follow=true", ["get", "", "ns", "pods", "log", "p"]),
        (
            "POST",
            "/api/v1/namespaces/ns/pods/p/exec",
            "command=ls",
            ["create", "", "ns", "pods", "exec", "p"],
        ),
        ("GET", "/api/v1/proxy/namespaces/ns/services/s/a/b", "", ["proxy", "", "ns", "services", "", "s"]),
    ];
    for (method, path, query, [verb, group, ns, resource, sub, name]) in rows {
        let m: Method = method.parse().unwrap();
        let info = request_info(&m, path, Some(query));
        let got = [
            info.verb.as_str(),
            info.api_group.as_str(),
            info.namespace.as_str(),
            info.resource.as_str(),
            info.subresource.as_str(),
            info.name.as_str(),
        ];
        assert_eq!(got, [*verb, *group, *ns, *resource, *sub, *name], "{method} {path}?{query}");
        assert!(info.is_resource_request, "{path}");
    }
    // Non-resource requests: the lowercase method and the path.
    for path in ["/api", "/api/v1", "/apis/apps/v1", "/version", "/metrics", "/"] {
        let info = request_info(&Method::GET, path, None);
        assert!(!info.is_resource_request, "{path}");
        assert_eq!((info.verb.as_str(), info.path.as_str()), ("get", path));
    }
}

/// KEP-4601 (requestinfo.go, 1.31+): the raw selectors (first value each, read even when the
/// ListOptions do not decode) for list, watch and deletecollection only, and never when the
/// verb came from a `/watch/` path.
#[test]
fn request_info_carries_the_selectors_of_collection_verbs() {
    let rows: &[(&str, &str, &str, [&str; 2])] = &[
        ("GET", CMS, "fieldSelector=spec.nodeName%3Dn1&labelSelector=a%21%3Db", ["spec.nodeName=n1", "a!=b"]),
        ("GET", CMS, "watch=1&fieldSelector=x%3D1&fieldSelector=x%3D2", ["x=1", ""]),
        ("GET", CMS, "limit=bogus&labelSelector=in+(", ["", "in ("]),
        ("DELETE", CMS, "labelSelector=a", ["", "a"]),
        ("GET", "/api/v1/watch/namespaces/ns/configmaps", "fieldSelector=x%3D1&labelSelector=a", ["", ""]),
        ("GET", "/api/v1/namespaces/ns/configmaps/a", "fieldSelector=x%3D1", ["", ""]),
        ("DELETE", "/api/v1/namespaces/ns/configmaps/a", "labelSelector=a", ["", ""]),
        ("POST", CMS, "labelSelector=a", ["", ""]),
    ];
    for (method, path, query, [field, label]) in rows {
        let info = request_info(&method.parse().unwrap(), path, Some(query));
        assert_eq!(
            [info.field_selector.as_str(), info.label_selector.as_str()],
            [*field, *label],
            "{method} {path}?{query}"
        );
    }
}

/// Every request the cache serves is authorized as the apiserver would: the classified plan's
/// verb is the RequestInfo's, and namespace and name are the RequestInfo's.
#[test]
fn cached_reads_agree_with_the_request_info() {
    let cases = [
        (CMS, "resourceVersion=0"),
        (CMS, "limit=2"),
        (CMS, "watch=1&resourceVersion=0"),
        (CMS, "watch=1&fieldSelector=metadata.name%3Da"),
        (CMS, "fieldSelector=metadata.name%3Da&resourceVersion=0"),
        ("/api/v1/namespaces/ns/configmaps/a", "resourceVersion=0"),
        ("/api/v1/configmaps", "resourceVersion=0"),
        ("/api/v1/watch/namespaces/ns/configmaps", "fieldSelector=metadata.name%3Da"),
        ("/api/v1/watch/namespaces/ns/configmaps/a", "resourceVersion=0"),
        ("/api/v1/nodes/n1", "resourceVersion=0"),
        ("/api/v1/nodes", "watch=1&fieldSelector=metadata.name%3Dn1"),
        ("/api/v1/namespaces/X", "resourceVersion=0"),
        ("/api/v1/namespaces", "resourceVersion=0&fieldSelector=metadata.name%3DX"),
        ("/apis/apps/v1/deployments", "resourceVersion=0"),
        // Odd queries are read one way for both (Go's `url.ParseQuery`): a pair with a bad
        // escape or a `;` is no parameter, a second `?` is part of the key.
        (CMS, "watch=1%ZZ&resourceVersion=0"),
        (CMS, "resourceVersion=0&fieldSelector=metadata.name%3Da%ZZ"),
        (CMS, "resourceVersion=0&fieldSelector=metadata.name%3Db;&labelSelector=x%3D1"),
        (CMS, "?watch=1&resourceVersion=0"),
    ];
    for (path, query) in cases {
        let Route::Cache(cr) = route(Method::GET, path, query, None) else {
            panic!("{path}?{query}: not served from the cache");
        };
        let info = request_info(&Method::GET, path, Some(query));
        assert_eq!(info.verb, cr.plan.verb(), "{path}?{query}");
        assert_eq!(info.resource, cr.kind.resource, "{path}?{query}");
        assert_eq!(info.api_group, cr.kind.group, "{path}?{query}");
        // (The legacy `/watch/` path carries no selectors to authorize, as in Go.)
        if info.verb != "get" && !path.contains("/watch/") {
            // What is authorized is what is served (1.34 authorizes selectors).
            assert_eq!(info.field_selector, cr.opts.field_selector, "{path}?{query}");
            assert_eq!(info.label_selector, cr.opts.label_selector, "{path}?{query}");
        }
    }
}

#[test]
fn long_running_comes_from_the_request_info() {
    let long =
        |method: Method, path: &str, query: &str| is_long_running(&request_info(&method, path, Some(query)));
    // Watches, served or forwarded, in every spelling the apiserver accepts.
    assert!(long(Method::GET, CMS, "watch=true"));
    assert!(long(Method::GET, CMS, "watch="));
    assert!(long(Method::GET, "/api/v1/secrets", "watch=1"));
    assert!(long(Method::GET, "/api/v1/watch/namespaces/ns/configmaps", ""));
    assert!(long(Method::GET, "/apis/apps/v1/watch/namespaces/a/deployments", ""));
    // Following a pod's log; proxies (as the apiserver).
    assert!(long(Method::GET, "/api/v1/namespaces/a/pods/p/log", "follow=true"));
    assert!(long(Method::GET, "/api/v1/namespaces/a/pods/p/log", "follow=1&container=c"));
    assert!(long(Method::GET, "/api/v1/namespaces/a/services/s/proxy/x", ""));
    // Raw flags on other requests do not make them long-running.
    assert!(!long(Method::GET, CMS, "resourceVersion=0&follow=1"));
    assert!(!long(Method::GET, CMS, "watch=false&follow=true"));
    assert!(!long(Method::GET, CMS, "watch=0"));
    assert!(!long(Method::GET, "/api/v1/namespaces/ns/configmaps/a", "watch=1"));
    // Any `log` subresource, followed or not (the apiserver's `longRunningSubresources`).
    assert!(long(Method::GET, "/api/v1/namespaces/a/pods/p/log", ""));
    assert!(long(Method::GET, "/api/v1/namespaces/a/pods/p/log", "follow=false"));
    assert!(long(Method::GET, "/apis/example.com/v1/namespaces/a/widgets/w/log", ""));
    assert!(!long(Method::GET, "/api/v1/namespaces/a/pods/log", ""), "a pod named log");
    assert!(!long(Method::GET, "/api/v1/namespaces/watch/pods", ""));
    assert!(!long(Method::GET, "/api/v1/pods", "follow=true"));
    // exec/attach/portforward are long-running only once upgraded (the server decides after
    // the upstream's 101), not for their path.
    assert!(!long(Method::POST, "/api/v1/namespaces/a/pods/p/exec", "command=ls"));
    assert!(!long(Method::GET, "/version", "watch=1"));
}

#[test]
fn request_info_never_panics_on_odd_paths() {
    for path in [
        "",
        "/",
        "//",
        "/api",
        "/api/v1",
        "/api/v1/watch",
        "/apis/g/v1/proxy",
        "/api/v1/namespaces",
        "//api//v1//",
        "/api/v1/%zz/%ff",
        "/apis/g",
        "/apis/g/v1",
        "/api/v1/watch/namespaces",
        "/api/v1/namespaces//pods",
        "/api/v1/proxy/namespaces/ns/pods/p/a/b/c",
    ] {
        for method in [Method::GET, Method::DELETE, Method::OPTIONS] {
            for query in [None, Some("watch"), Some("fieldSelector=metadata.name%3D%5C"), Some("%zz=%ff")] {
                let info = request_info(&method, path, query);
                let _ = is_long_running(&info);
            }
        }
    }
    let info = request_info(&Method::GET, "/api/v1/watch", None);
    assert_eq!((info.verb.as_str(), info.resource.as_str()), ("get", ""), "no resource after the verb");
}

/// Issue 30 §1: a namespace or name the apiserver would route, refuse or look up otherwise is
/// never served from the cache; the request goes upstream with the caller's identity, and its
/// RequestInfo is the apiserver's (the decoded path split on every `/`, `%2F` included).
#[test]
fn unusual_namespaces_and_names_are_the_apiservers_to_answer() {
    let injected = "/api/v1/namespaces/kube-system%2Fsecrets%2Fsuper-secret%3Fx%3D/pods";
    for query in [
        "watch=1",
        "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        "",
        "resourceVersion=0",
    ] {
        assert_eq!(forward(injected, query), ForwardReason::UnusualPath, "{query}");
    }
    let info = request_info(&Method::GET, injected, Some("watch=1"));
    assert_eq!(
        [&*info.verb, &*info.namespace, &*info.resource, &*info.name, &*info.subresource],
        ["get", "kube-system", "secrets", "super-secret?x=", "pods"],
        "as the apiserver routes it: a subresource of a Secret"
    );
    let rows = [
        // An encoded `/` in a name: the apiserver answers 404 (or routes a subresource).
        ("/api/v1/configmaps/team-a%2Fother-secret", "resourceVersion=0"),
        ("/api/v1/namespaces/team-a/configmaps/a%2Fb", "resourceVersion=0"),
        ("/api/v1/namespaces/team-a/configmaps/a%2fb", "resourceVersion=0"),
        // A namespaced object named without its namespace: no such route upstream (404).
        ("/api/v1/configmaps/a", "resourceVersion=0"),
        ("/api/v1/watch/configmaps/a", "resourceVersion=0"),
        ("/api/v1/configmaps/a", "watch=1&resourceVersion=0"),
        // Not valid path segment names: the apiserver's 400.
        ("/api/v1/namespaces/ns/configmaps/..", "resourceVersion=0"),
        ("/api/v1/namespaces/ns/configmaps/.", "resourceVersion=0"),
        ("/api/v1/namespaces/ns/configmaps/a%25b", "resourceVersion=0"),
        ("/api/v1/nodes/n%2F1", "resourceVersion=0"),
        ("/api/v1/namespaces/a%2Fb", "resourceVersion=0"),
        // Namespaces that are not DNS labels.
        ("/api/v1/namespaces/Kube-System/configmaps", "resourceVersion=0"),
        ("/api/v1/namespaces/a.b/configmaps", "watch=1"),
        ("/api/v1/namespaces/-a/configmaps", "resourceVersion=0"),
        ("/api/v1/namespaces/a%20b/configmaps", "resourceVersion=0"),
        ("/api/v1/namespaces/a%3Fb/configmaps", "resourceVersion=0"),
        (&format!("/api/v1/namespaces/{}/configmaps", "a".repeat(64)), "resourceVersion=0"),
        ("/apis/apps/v1/namespaces/ns%2F..%2Fx/deployments", "resourceVersion=0"),
    ];
    for (path, query) in rows {
        assert_eq!(forward(path, query), ForwardReason::UnusualPath, "{path}?{query}");
    }
    // Still served: the longest label, digits, dashes inside.
    let ns63 = format!("/api/v1/namespaces/{}/configmaps", "a".repeat(63));
    for path in
        [&*ns63, "/api/v1/namespaces/0-a-9/configmaps", "/api/v1/namespaces/ns/configmaps/a.b_c-d~e:f"]
    {
        assert!(matches!(route(Method::GET, path, "resourceVersion=0", None), Route::Cache(_)), "{path}");
    }
}

#[test]
fn dns_labels_as_go_validates_them() {
    for ok in ["a", "0", "a-b", "kube-system", &"x".repeat(63)] {
        assert!(crate::selector::is_dns1123_label_name(ok), "{ok}");
    }
    for bad in ["", "-a", "a-", "A", "a.b", "a_b", "a/b", "ä", &"x".repeat(64)] {
        assert!(!crate::selector::is_dns1123_label_name(bad), "{bad}");
    }
}

/// `shardSelector` (KEP-5866): parsed for LIST and WATCH only, after the 400 / 422 checks and
/// before continue / resourceVersion (the registry parses it before asking storage); forms
/// only CEL reads go upstream.
#[test]
fn shard_selectors() {
    let q = |sel: &str, rest: &str| {
        format!(
            "{rest}&shardSelector={}",
            form_urlencoded::byte_serialize(sel.as_bytes()).collect::<String>()
        )
    };
    let half = "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')";
    for query in [q(half, "resourceVersion=0"), q(half, "watch=1&resourceVersion=5")] {
        match route(Method::GET, CMS, &query, None) {
            Route::Cache(c) => assert_eq!(c.shard.as_deref().map(ToString::to_string).as_deref(), Some(half)),
            other => panic!("{query}: {other:?}"),
        }
    }
    // GET carries GetOptions: no shard.
    match route(Method::GET, &format!("{CMS}/a"), &q(half, "resourceVersion=0"), None) {
        Route::Cache(c) => assert!(c.shard.is_none()),
        other => panic!("{other:?}"),
    }
    let bad = "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')";
    let text = "invalid shard selector: unsupported field path \"object.metadata.name\"; supported: object.metadata.uid, object.metadata.namespace";
    assert_eq!(reject(CMS, &q(bad, "resourceVersion=0")), (500, text.into()));
    // Before the continue token and the resourceVersion, after ListOptions validation.
    // (with a continue token: the apiserver's to refuse, `UnusualQuery`)
    assert_eq!(forward(CMS, &q(bad, "continue=x")), ForwardReason::UnusualQuery);
    assert_eq!(reject(CMS, &q(bad, "resourceVersion=x")).0, 500);
    assert_eq!(reject(CMS, &q(bad, "resourceVersionMatch=Exact")).0, 422);
    assert_eq!(reject(CMS, &q(bad, "labelSelector=a%20b")).0, 400);
    assert_eq!(forward(CMS, &q(&format!("({half})"), "resourceVersion=0")), ForwardReason::ShardSelector);
    assert_eq!(ForwardReason::ShardSelector.as_str(), "shard_selector");
    // Empty: no selector.
    match route(Method::GET, CMS, "resourceVersion=0&shardSelector=", None) {
        Route::Cache(c) => assert!(c.shard.is_none()),
        other => panic!("{other:?}"),
    }
}
