//! The user of a TLS connection's verified client certificate chain ([`PeerUser`]), and
//! whether that chain still authenticates at a request: kube-apiserver verifies a client's
//! chain at every request, so a connection kept open, or a TLS session resumed (rustls restores
//! the chain without verifying it), must not authenticate past the chain's `notAfter` or after
//! `--client-ca-file` stopped trusting it.
//!
//! Made by the listener once per TLS connection; read by `Auth::authenticate`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(test)]
use rustls_pki_types::pem::PemObject;
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
    /// The `notAfter`s of the certificates sent (Unix seconds), earliest first.
    not_afters: Box<[i64]>,
    /// Until when the last successful verification holds: the earliest `notAfter` ahead of it.
    /// Past it the chain is verified again (a path that does not use the expired certificate —
    /// an old intermediate sent along — still verifies, as Go builds it; and then holds until
    /// the next `notAfter`, so a chain padded with expired certificates costs one verification
    /// per expiry, not one per request: two reviews).
    until: AtomicI64,
    certs: Box<[CertificateDer<'static>]>,
    ca: Option<Arc<ClientCa>>,
    /// `generation << 1 | trusted`: the bundle generation the chain was last verified
    /// against and the outcome; [`UNVERIFIED`] before the first.
    verified: AtomicU64,
}

const UNVERIFIED: u64 = u64::MAX;

/// The most of a chain kept with its connection (to verify it again): a client could pad its
/// chain with valid certificates up to the handshake's limit. A longer chain authenticates
/// nothing (its requests get 401, or go by their token).
pub const MAX_KEPT_CHAIN: usize = 16 * 1024;

impl PeerUser {
    /// The user of a chain (leaf first) verified at a full handshake against `ca`'s bundle of
    /// generation `verified_at` (`None`: a resumed session, or a bundle reloaded during the
    /// handshake — verified again at its first request). `None` without a CommonName. A leaf
    /// whose `notAfter` cannot be read (the verifier read it: never expected), or a chain
    /// longer than [`MAX_KEPT_CHAIN`], authenticates nothing: past its bound from the start,
    /// and nothing kept to verify.
    pub fn of_chain(
        chain: &[CertificateDer<'_>],
        ca: Option<Arc<ClientCa>>,
        verified_at: Option<u64>,
    ) -> Option<PeerUser> {
        let leaf = chain.first()?;
        let user = super::x509::user(leaf)?;
        let oversized = chain.iter().map(|c| c.len()).sum::<usize>() > MAX_KEPT_CHAIN;
        let not_afters: Box<[i64]> = match (super::x509::not_after(leaf), oversized) {
            (Some(_), false) => {
                let mut all: Vec<i64> = chain.iter().filter_map(|c| super::x509::not_after(c)).collect();
                all.sort_unstable();
                all.into()
            }
            _ => Box::new([i64::MIN]),
        };
        let until = not_afters.first().copied().unwrap_or(i64::MIN).into();
        let verified = verified_at.filter(|_| !oversized).map_or(UNVERIFIED, |g| g << 1 | 1);
        let certs =
            if oversized { Box::default() } else { chain.iter().map(|c| c.clone().into_owned()).collect() };
        Some(PeerUser {
            user: Arc::new(user),
            chain: Arc::new(PeerChain { not_afters, until, certs, ca, verified: verified.into() }),
        })
    }

    /// Whether the chain authenticates at `now`: trusted by the current client CA bundle
    /// (verified again once per connection after each reload of the bundle), and within the
    /// validity of its path's certificates (verified again past each `notAfter` of the
    /// certificates sent; a failure holds until the bundle changes — time does not go back).
    pub fn valid_at(&self, now: SystemTime) -> bool {
        let nanos = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
        // Go's `x509` refuses a time after a path certificate's `notAfter`.
        let past = |t: i64| nanos > i128::from(t) * 1_000_000_000;
        let until = self.chain.until.load(Ordering::Acquire);
        let Some(ca) = &self.chain.ca else { return !past(until) };
        let generation = ca.generation();
        let last = self.chain.verified.load(Ordering::Acquire);
        if last != UNVERIFIED && last >> 1 == generation && (last & 1 == 0 || !past(until)) {
            return last & 1 == 1;
        }
        let trusted = ca.verifies(&self.chain.certs, now);
        if trusted {
            // The next notAfter ahead; none ahead (webpki reads time to the second, so a path
            // certificate is still valid in the second after its notAfter): the last one, so
            // that each request verifies again until it fails.
            let afters = &self.chain.not_afters;
            let last_after = afters.last().copied().unwrap_or(i64::MAX);
            let next = afters.iter().copied().find(|&t| !past(t)).unwrap_or(last_after);
            self.chain.until.store(next, Ordering::Release);
        }
        self.chain.verified.store(generation << 1 | u64::from(trusted), Ordering::Release);
        trusted
    }
}

#[cfg(test)]
mod tests {
    use super::super::client_ca::tests::{ca_file, TestCa};
    use super::*;

    /// Past the earliest `notAfter` of the certificates sent, the chain is verified at each
    /// request: an expired certificate sent along but off the path (an old intermediate) ends
    /// nothing, as Go builds the path (a review: it made every request 401).
    #[test]
    fn an_expired_certificate_off_the_path_ends_nothing() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let (ca, stale) = (TestCa::until(now + 3600), TestCa::until(now - 3600));
        let (bundle, path) = ca_file(&[&ca.pem]);
        let leaf = ca.leaf("alice");
        let stale_der = CertificateDer::from_pem_slice(stale.pem.as_bytes()).unwrap();
        let sent = [leaf.clone(), stale_der];
        let generation = Some(bundle.generation());
        let with_stale = PeerUser::of_chain(&sent, Some(bundle.clone()), generation).unwrap();
        assert!(with_stale.valid_at(SystemTime::now()), "the path is the leaf and its valid CA");
        // That verification holds until the next notAfter ahead (the leaf's): not one per request.
        assert_eq!(with_stale.chain.until.load(Ordering::Relaxed), 4_102_444_800, "2100-01-01");
        // A leaf whose own CA is gone from the bundle: past nothing, but no longer trusted.
        let other = TestCa::until(now + 3600);
        std::fs::write(&path, &other.pem).unwrap();
        assert_eq!(bundle.reload_if_changed(), Ok(true));
        let alone =
            PeerUser::of_chain(std::slice::from_ref(&leaf), Some(bundle.clone()), generation).unwrap();
        assert!(!alone.valid_at(SystemTime::now()), "verified again against the new bundle");
        assert!(!with_stale.valid_at(SystemTime::now()));
        let _ = std::fs::remove_file(path);
    }

    /// A leaf that expires stops authenticating at its notAfter, whatever was verified before.
    #[test]
    fn an_expiring_leaf_stops_at_its_not_after() {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let ca = TestCa::until(now + 3600);
        let (bundle, path) = ca_file(&[&ca.pem]);
        let leaf = ca.leaf_until("erin", now + 100);
        let p =
            PeerUser::of_chain(std::slice::from_ref(&leaf), Some(bundle.clone()), Some(bundle.generation()))
                .unwrap();
        let at = |secs: i64| UNIX_EPOCH + std::time::Duration::from_secs(secs as u64);
        assert!(p.valid_at(at(now + 50)));
        assert!(p.valid_at(at(now + 100)), "through its notAfter");
        // Within the second after it webpki (seconds) still verifies it; that must not hold.
        let just_after = at(now + 100) + std::time::Duration::from_millis(300);
        let _ = p.valid_at(just_after);
        assert!(!p.valid_at(at(now + 101)), "past it");
        assert!(!p.valid_at(at(now + 102)), "and for good");
        let _ = std::fs::remove_file(path);
    }

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
        assert_eq!(alone.chain.not_afters[0], 4_102_444_800, "2100-01-01");
        let chained = PeerUser::of_chain(&[leaf.clone(), intermediate], None, Some(1)).unwrap();
        assert_eq!(chained.chain.not_afters[0], 3_786_912_000, "2090-01-01, the intermediate's");
        // An unreadable certificate beside the leaf bounds nothing (the handshake verified the
        // path); an unreadable leaf, or a chain past what is kept, is past its bound at once.
        let garbage = CertificateDer::from(b"garbage".to_vec());
        let with_garbage = PeerUser::of_chain(&[leaf.clone(), garbage], None, Some(1)).unwrap();
        assert_eq!(with_garbage.chain.not_afters[0], 4_102_444_800);
        let padded = vec![leaf.clone(); MAX_KEPT_CHAIN / leaf.len() + 1];
        let oversized = PeerUser::of_chain(&padded, None, Some(1)).unwrap();
        assert!(!oversized.valid_at(SystemTime::now()), "too long a chain authenticates nothing");
        assert!(oversized.chain.certs.is_empty(), "and is not kept");
        let alone = PeerUser::of_chain(&[cert("alice", 2126)], None, Some(1)).unwrap();
        assert_eq!(alone.chain.not_afters[0], 4_922_899_200, "2126-01-01");
        let at = |secs: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs);
        assert!(alone.valid_at(at(4_922_899_200)), "valid through its notAfter");
        assert!(!alone.valid_at(at(4_922_899_200) + std::time::Duration::from_millis(1)));
    }
}
