//! The user of a TLS connection's verified client certificate chain ([`PeerUser`]), and
//! whether that chain still authenticates at a request: kube-apiserver verifies a client's
//! chain at every request, so a connection kept open, or a TLS session resumed (rustls restores
//! the chain without verifying it), must not authenticate past the chain's `notAfter` or after
//! `--client-ca-file` stopped trusting it.
//!
//! Made by the listener once per TLS connection; read by `Auth::authenticate`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustls_pki_types::CertificateDer;

use super::client_ca::ClientCa;
use super::user::UserInfo;

/// The verified client certificate's user of a TLS connection, put into each request's
/// extensions by the listener. The apiserver verifies a client's chain at every request, so
/// a connection kept open — or a TLS session resumed, which restores the chain without
/// verifying it — authenticates only while its chain is within its earliest `notAfter` and
/// trusted by the current `--client-ca-file` ([`PeerUser::valid_at`]).
#[derive(Clone, Debug)]
pub struct PeerUser {
    pub user: Arc<UserInfo>,
    chain: Arc<PeerChain>,
}

#[derive(Debug)]
struct PeerChain {
    /// The earliest `notAfter` of the chain (Unix seconds).
    not_after: i64,
    certs: Box<[CertificateDer<'static>]>,
    ca: Option<Arc<ClientCa>>,
    /// `generation << 1 | trusted`: the bundle generation the chain was last verified
    /// against and the outcome; [`UNVERIFIED`] before the first.
    verified: AtomicU64,
}

const UNVERIFIED: u64 = u64::MAX;

impl PeerUser {
    /// The user of a chain (leaf first) verified at a full handshake against `ca`'s bundle of
    /// generation `verified_at` (`None`: a resumed session, or a bundle reloaded during the
    /// handshake — verified again at its first request). `None` without a CommonName, or when
    /// a certificate's `notAfter` cannot be read (the verifier read it: never expected, and
    /// then nothing is authenticated from the certificate rather than without a bound).
    pub fn of_chain(
        chain: &[CertificateDer<'_>],
        ca: Option<Arc<ClientCa>>,
        verified_at: Option<u64>,
    ) -> Option<PeerUser> {
        let user = super::x509::user(chain.first()?)?;
        let not_after = chain.iter().map(|c| super::x509::not_after(c)).min()??;
        let verified = verified_at.map_or(UNVERIFIED, |g| g << 1 | 1);
        let certs = chain.iter().map(|c| c.clone().into_owned()).collect();
        Some(PeerUser {
            user: Arc::new(user),
            chain: Arc::new(PeerChain { not_after, certs, ca, verified: verified.into() }),
        })
    }

    /// Whether the chain has expired at `now`: Go's `x509` verification refuses a time after
    /// `notAfter`.
    pub fn expired_at(&self, now: SystemTime) -> bool {
        let nanos = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
        nanos > i128::from(self.chain.not_after) * 1_000_000_000
    }

    /// Whether the chain authenticates at `now`: not expired, and trusted by the current
    /// client CA bundle (verified again once per connection after each reload of the bundle).
    pub fn valid_at(&self, now: SystemTime) -> bool {
        if self.expired_at(now) {
            return false;
        }
        let Some(ca) = &self.chain.ca else { return true };
        let generation = ca.generation();
        let last = self.chain.verified.load(Ordering::Acquire);
        if last != UNVERIFIED && last >> 1 == generation {
            return last & 1 == 1;
        }
        let trusted = ca.verifies(&self.chain.certs, now);
        self.chain.verified.store(generation << 1 | u64::from(trusted), Ordering::Release);
        trusted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chain's earliest `notAfter` bounds its user; an unreadable certificate in it, no user.
    #[test]
    fn a_peer_user_is_bounded_by_its_chains_earliest_not_after() {
        let cert = |cn: &str, year: i32| {
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            p.not_after = rcgen::date_time_ymd(year, 1, 1);
            CertificateDer::from(p.self_signed(&rcgen::KeyPair::generate().unwrap()).unwrap().der().to_vec())
        };
        let (leaf, intermediate) = (cert("alice", 2100), cert("some CA", 2090));
        let alone = PeerUser::of_chain(std::slice::from_ref(&leaf), None, Some(1)).unwrap();
        assert_eq!(alone.user.name, "alice");
        assert_eq!(alone.chain.not_after, 4_102_444_800, "2100-01-01");
        let chained = PeerUser::of_chain(&[leaf.clone(), intermediate], None, Some(1)).unwrap();
        assert_eq!(chained.chain.not_after, 3_786_912_000, "2090-01-01, the intermediate's");
        assert!(
            PeerUser::of_chain(&[leaf, CertificateDer::from(b"garbage".to_vec())], None, Some(1)).is_none()
        );
        let alone = PeerUser::of_chain(&[cert("alice", 2126)], None, Some(1)).unwrap();
        assert_eq!(alone.chain.not_after, 4_922_899_200, "2126-01-01");
        let at = |secs: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        assert!(!alone.expired_at(at(4_922_899_200)), "valid through its notAfter");
        assert!(alone.expired_at(at(4_922_899_200) + std::time::Duration::from_millis(1)));
    }
}
