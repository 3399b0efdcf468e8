//! The `restart` scenario's load balancer for its rollout case: a TCP round-robin in front of
//! the proxy replicas, as a Service's would be. Each new connection goes to the next replica
//! that accepts it (one refusing, because it is restarting, is skipped); a connection ends when
//! either side closes it, so a replica's shutdown sends its clients back through here.
//!
//! Started by `restart` (case e), stopped when dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running balancer.
pub struct Balancer {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Balancer {
    /// Listens on a loopback port in front of `backends`.
    pub async fn start(backends: Vec<SocketAddr>) -> Result<Balancer, String> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.map_err(|e| format!("balancer: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("balancer: {e}"))?;
        let backends = Arc::new(backends);
        let next = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { continue };
                let (backends, next) = (backends.clone(), next.clone());
                tokio::spawn(async move {
                    let first = next.fetch_add(1, Relaxed);
                    for k in 0..backends.len() {
                        let b = backends[(first + k) % backends.len()];
                        if let Ok(upstream) = TcpStream::connect(b).await {
                            pipe(client, upstream).await;
                            return;
                        }
                    }
                    // Every replica refused: the client sees its connection closed.
                });
            }
        });
        Ok(Balancer { addr, task })
    }
}

async fn pipe(mut client: TcpStream, mut upstream: TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_once(listener: TcpListener, tag: u8) {
        if let Ok((mut s, _)) = listener.accept().await {
            let mut b = [0u8; 1];
            if s.read_exact(&mut b).await.is_ok() {
                let _ = s.write_all(&[tag]).await;
            }
        }
    }

    #[tokio::test]
    async fn a_refusing_replica_is_skipped() {
        let up = TcpListener::bind("127.0.0.1:0").await.unwrap();
        // A port nobody listens on: bound, then closed.
        let gone = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let lb = Balancer::start(vec![gone, up.local_addr().unwrap()]).await.unwrap();
        let server = tokio::spawn(echo_once(up, 7));
        let mut c = TcpStream::connect(lb.addr).await.unwrap();
        c.write_all(&[1]).await.unwrap();
        let mut b = [0u8; 1];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(b[0], 7, "the connection reached the replica that listens");
        server.await.unwrap();
    }
}
