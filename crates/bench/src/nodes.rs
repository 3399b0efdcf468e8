//! Node identities (`bench --node-identities`): every node watcher is a kubelet-like client with
//! a client certificate of its own (`CN=system:node:node-<n>, O=system:nodes`, signed by the
//! in-process CA or `--node-ca-cert`/`--node-ca-key`), on its own connection (HTTP/2 with
//! `--http2`), sending `Accept: application/vnd.kubernetes.protobuf,application/json` as kubelets
//! do (`application/json` with `--node-json`) and no bearer token, so that the proxy authorizes each node as the Node authorizer sees it.
//! Each node's pods mount a Secret `bench-node-<n>` (in the pod's namespace; its shape is
//! `env`'s, with the pods'), which the node GETs as a kubelet does.
//!
//! Called by `modes` (the identities, once a run) and `phase` (each phase's clients, for the
//! watchers and the GET driver).

use std::sync::Arc;

use bytes::Bytes;
use http::header::ACCEPT;
use http::{HeaderValue, Method, Request};
use http_body_util::Full;
use rcgen::{Issuer, KeyPair};

use super::certs::node_certificate;
use super::env::{HttpClient, Target};
use super::tls::ClientTls;

/// What kubelets (and kube-proxy) send: protobuf first, JSON accepted.
pub const KUBELET_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";

/// What the nodes ask for with `--node-json`: JSON only (to compare a delivery's cost in both).
pub const JSON_ACCEPT: &str = "application/json";

/// Each node's TLS identity (making them is the slow part), made once for the whole run; each
/// phase makes its own clients from them ([`NodeIdentities::clients`]).
pub struct NodeIdentities {
    identities: Vec<ClientTls>,
    http2: bool,
    /// [`KUBELET_ACCEPT`], or [`JSON_ACCEPT`] with `--node-json`.
    accept: &'static str,
}

impl NodeIdentities {
    /// Certificates for `node-0 .. node-{nodes-1}` signed by `ca`; `roots` verify the target.
    pub fn new(
        ca: &Issuer<'_, KeyPair>,
        roots: &[rustls_pki_types::CertificateDer<'static>],
        nodes: usize,
        http2: bool,
        json: bool,
    ) -> Result<Arc<NodeIdentities>, String> {
        let mut identities = Vec::with_capacity(nodes);
        for n in 0..nodes {
            let (cert, key) = node_certificate(&format!("node-{n}"), ca)?;
            identities.push(ClientTls::with_identity(roots.to_vec(), cert.as_bytes(), key.as_bytes())?);
        }
        let accept = if json { JSON_ACCEPT } else { KUBELET_ACCEPT };
        Ok(Arc::new(NodeIdentities { identities, http2, accept }))
    }

    /// One client per node on these identities, with no connection yet: each phase takes its
    /// own, so that the last phase's pooled connections (one per node, idle up to 30 s) are
    /// closed when that phase drops its clients rather than held open beside the next phase's
    /// — at 10 000 nodes the two phases together would need 20 000 file descriptors, and the
    /// opens past the limit failed (`EMFILE`, counted as the target's transport errors).
    pub fn clients(&self) -> Arc<NodeClients> {
        let clients = self
            .identities
            .iter()
            .map(|tls| {
                let mut b = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
                b.pool_idle_timeout(std::time::Duration::from_secs(30)).http2_only(self.http2);
                b.build(tls.connector(self.http2))
            })
            .collect();
        Arc::new(NodeClients { clients, accept: self.accept })
    }
}

/// One client per node, each presenting that node's certificate (one phase's).
pub struct NodeClients {
    clients: Vec<HttpClient>,
    accept: &'static str,
}

impl NodeClients {
    pub fn client(&self, node: usize) -> &HttpClient {
        &self.clients[node % self.clients.len()]
    }

    /// A kubelet's request: its Accept, no bearer token (the certificate is the identity).
    pub fn request(
        &self,
        target: &Target,
        method: Method,
        path_and_query: &str,
    ) -> Option<Request<Full<Bytes>>> {
        Request::builder()
            .method(method)
            .uri(format!("{}{}", target.base, path_and_query))
            .header(ACCEPT, HeaderValue::from_static(self.accept))
            .body(Full::new(Bytes::new()))
            .ok()
    }
}
