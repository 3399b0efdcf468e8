//! A client's copy of one resource, kept as an informer keeps it: a LIST, then watch events
//! applied in order (the RV of the last one is where it resumes), a relist after 410. Used by
//! `tests/reliability/relist.rs` and `tests/model.rs` to check that any prefix of a stream, followed by a
//! resume at the proxy, another replica or the apiserver, leaves the right state.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use super::HttpClient;

/// What a client holds: `namespace/name` → resourceVersion, and the RV it would resume from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mirror {
    pub objects: BTreeMap<String, u64>,
    pub rv: u64,
    /// Events that make no sense for the state held: ADDED of a present object, MODIFIED or
    /// DELETED of an absent one, an RV going back.
    pub anomalies: Vec<String>,
}

fn key(o: &Value) -> String {
    format!(
        "{}/{}",
        o["metadata"]["namespace"].as_str().unwrap_or(""),
        o["metadata"]["name"].as_str().unwrap_or("")
    )
}

fn rv(o: &Value) -> u64 {
    o["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The outcome of one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    Change,
    Bookmark {
        end_of_initial: bool,
    },
    /// An ERROR event with this code (410: relist).
    Error(u64),
}

impl Mirror {
    /// A LIST at `base` + `path` (absolute URL, any query): the state and its RV. `None` when
    /// the answer is not a 200 list.
    pub async fn list(client: &HttpClient, url: &str) -> Option<Mirror> {
        let req = Request::get(url).body(Full::new(Bytes::new())).ok()?;
        let resp = tokio::time::timeout(Duration::from_secs(20), client.request(req)).await.ok()?.ok()?;
        if resp.status() != 200 {
            return None;
        }
        let body =
            tokio::time::timeout(Duration::from_secs(20), resp.into_body().collect()).await.ok()?.ok()?;
        let v: Value = serde_json::from_slice(&body.to_bytes()).ok()?;
        let objects = v["items"].as_array()?.iter().map(|o| (key(o), rv(o))).collect();
        let rv = v["metadata"]["resourceVersion"].as_str()?.parse().ok()?;
        Some(Mirror { objects, rv, anomalies: Vec::new() })
    }

    /// Applies one initial event of a watch-list (ADDED in key order, their own RVs, then the
    /// `k8s.io/initial-events-end` BOOKMARK at the list RV); returns whether that was the end.
    pub fn initial(&mut self, ev: &Value) -> bool {
        let o = &ev["object"];
        match ev["type"].as_str().unwrap_or("") {
            "ADDED" => {
                self.objects.insert(key(o), rv(o));
                false
            }
            "BOOKMARK" => {
                self.rv = rv(o);
                o["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
            }
            other => {
                self.anomalies.push(format!("{other} among the initial events: {ev}"));
                true
            }
        }
    }

    /// Applies one watch event.
    pub fn apply(&mut self, ev: &Value) -> Applied {
        let o = &ev["object"];
        let t = ev["type"].as_str().unwrap_or("");
        if t == "ERROR" {
            return Applied::Error(o["code"].as_u64().unwrap_or(0));
        }
        let r = rv(o);
        if r < self.rv {
            self.anomalies.push(format!("{t} {} at {r} after {}", key(o), self.rv));
        }
        self.rv = self.rv.max(r);
        let k = key(o);
        match t {
            "BOOKMARK" => {
                let end = o["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true";
                return Applied::Bookmark { end_of_initial: end };
            }
            "ADDED" => {
                if self.objects.insert(k.clone(), r).is_some() {
                    self.anomalies.push(format!("ADDED {k} at {r}, already held"));
                }
            }
            "MODIFIED" => {
                if self.objects.insert(k.clone(), r).is_none() {
                    self.anomalies.push(format!("MODIFIED {k} at {r}, not held"));
                }
            }
            "DELETED" => {
                if self.objects.remove(&k).is_none() {
                    self.anomalies.push(format!("DELETED {k} at {r}, not held (a ghost deletion)"));
                }
            }
            other => self.anomalies.push(format!("unexpected event type {other:?}")),
        }
        Applied::Change
    }
}

/// What a watch stream gave next.
#[derive(Debug)]
pub enum Next {
    Event(Value),
    /// The stream ended (cleanly or not).
    End,
    /// Nothing arrived for the idle time.
    Idle,
}

/// An open watch read event by event.
pub struct Stream {
    body: Option<hyper::body::Incoming>,
    buf: Vec<u8>,
    /// The response status (0 when there was none).
    pub status: u16,
}

impl Stream {
    pub async fn open(client: &HttpClient, url: &str) -> Stream {
        Stream::open_with(client, url, &[]).await
    }

    /// The same with request headers (an `Accept` with parameters, for example).
    pub async fn open_with(client: &HttpClient, url: &str, headers: &[(&str, &str)]) -> Stream {
        let mut b = Request::get(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let req = b.body(Full::new(Bytes::new())).unwrap();
        match tokio::time::timeout(Duration::from_secs(20), client.request(req)).await {
            Ok(Ok(resp)) => {
                Stream { status: resp.status().as_u16(), body: Some(resp.into_body()), buf: Vec::new() }
            }
            _ => Stream { status: 0, body: None, buf: Vec::new() },
        }
    }

    pub async fn next(&mut self, idle: Duration) -> Next {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                if line.len() > 1 {
                    return match serde_json::from_slice(&line[..line.len() - 1]) {
                        Ok(v) => Next::Event(v),
                        Err(_) => Next::End,
                    };
                }
                continue;
            }
            let Some(body) = self.body.as_mut() else { return Next::End };
            match tokio::time::timeout(idle, body.frame()).await {
                Err(_) => return Next::Idle,
                Ok(Some(Ok(f))) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Ok(_) => {
                    self.body = None;
                    return Next::End;
                }
            }
        }
    }

    /// Every event until the stream ends or stays idle; and whether it ended.
    pub async fn collect(&mut self, idle: Duration) -> (Vec<Value>, bool) {
        let mut out = Vec::new();
        loop {
            match self.next(idle).await {
                Next::Event(v) => out.push(v),
                Next::End => return (out, true),
                Next::Idle => return (out, false),
            }
        }
    }
}

/// Resumes `m` at `base` (the proxy, another replica or the apiserver) as a client does: a
/// watch from its RV for `path` (a collection URL path), its events until the stream stays
/// idle for `idle`; on 410 a relist there, then again. Returns the state reached.
pub async fn resume(client: &HttpClient, base: &str, path: &str, mut m: Mirror, idle: Duration) -> Mirror {
    for _ in 0..5 {
        let url = format!("{base}{path}?watch=true&allowWatchBookmarks=true&resourceVersion={}", m.rv);
        let mut s = Stream::open(client, &url).await;
        let gone = loop {
            match s.next(idle).await {
                Next::Event(ev) => {
                    if let Applied::Error(code) = m.apply(&ev) {
                        assert_eq!(code, 410, "{url}: {ev}");
                        break true;
                    }
                }
                Next::End => break false,
                Next::Idle => return m,
            }
        };
        if gone {
            let anomalies = std::mem::take(&mut m.anomalies);
            m = Mirror::list(client, &format!("{base}{path}")).await.expect("relist");
            m.anomalies = anomalies;
        }
    }
    m
}
