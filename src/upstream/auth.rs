//! The proxy's own credentials at the HTTP layer: a bearer token, a token file re-read every
//! minute off the request path (bound service-account tokens rotate, and kube-client's config
//! loader does not refresh them), or an exec credential plugin's answer, renewed by a task
//! before it expires (the plugin itself is `exec.rs`). Client certificates live at the TLS
//! layer (`tls.rs`); one an exec plugin returns is swapped into the TLS layer's
//! [`IdentitySlot`] when renewed.
//!
//! Used by `client.rs` on the proxy's own requests only (forwarded requests never see these),
//! and by the bench for its clients' bearer token.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::errors::ConfigError;
use super::exec::{renew_at, Credential, ExecPlugin};
use super::identity::{Identity, IdentitySlot};

/// How often a token file is read again.
pub(crate) const TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// The proxy's bearer credentials.
pub enum Credentials {
    None,
    /// A fixed token (kubeconfig `token`). The header value is marked sensitive.
    Token(HeaderValue),
    TokenFile(TokenFile),
    /// An exec credential plugin's token (it may also have returned a client certificate).
    Exec(ExecAuth),
}

impl Credentials {
    /// A fixed bearer token.
    pub fn token(token: &str) -> Result<Credentials, String> {
        bearer(token).map(Credentials::Token)
    }

    /// The `Authorization` header to send, if any.
    pub fn header(&self) -> Option<HeaderValue> {
        match self {
            Credentials::None => None,
            Credentials::Token(h) => Some(h.clone()),
            Credentials::TokenFile(f) => Some(f.header()),
            Credentials::Exec(e) => e.header(),
        }
    }

    /// The upstream answered 401 to a request sent with `sent`: an exec plugin's credential is
    /// renewed now, unless it was since (client-go's exec round tripper, `maybeRefreshCreds`:
    /// a credential without an expiry, or revoked before it, is otherwise kept for good).
    pub fn unauthorized(&self, sent: Option<&HeaderValue>) {
        if let Credentials::Exec(e) = self {
            e.unauthorized(sent);
        }
    }

    /// For the startup log; never the token itself.
    pub fn describe(&self) -> String {
        match self {
            Credentials::None => "no bearer token".into(),
            Credentials::Token(_) => "bearer token".into(),
            Credentials::TokenFile(f) => format!("bearer token from {}", f.path.display()),
            Credentials::Exec(e) => e.plugin.describe(),
        }
    }
}

fn bearer(token: &str) -> Result<HeaderValue, String> {
    let token = token.trim();
    if token.is_empty() {
        return Err("the token is empty".into());
    }
    let mut h = HeaderValue::try_from(format!("Bearer {token}"))
        .map_err(|_| "the token contains characters not allowed in an HTTP header".to_string())?;
    h.set_sensitive(true);
    Ok(h)
}

/// A token file, read at start (a missing or empty file is a configuration error) and again
/// once [`TOKEN_REFRESH`] has passed. The re-read runs on a thread of its own, one at a time,
/// and the current token is sent meanwhile: a file on a mount that hangs (NFS) never stalls the
/// proxy's requests. A failed re-read keeps the previous token.
pub struct TokenFile {
    path: PathBuf,
    state: Arc<Mutex<Cached>>,
}

struct Cached {
    header: HeaderValue,
    read_at: Instant,
    /// A re-read is running.
    reading: bool,
}

impl TokenFile {
    pub fn open(path: &Path) -> Result<TokenFile, ConfigError> {
        let header = read_token(path).map_err(|e| ConfigError::read_file("token file", path, e))?;
        Ok(TokenFile::with(path, header))
    }

    /// A kubeconfig user with both `token` and `tokenFile`: the file wins, as in client-go
    /// (`NewBearerAuthWithRefreshRoundTripper`), and `token` is sent while the file cannot be
    /// read (it was the other way round: the file was never read).
    pub fn open_or(path: &Path, token: HeaderValue) -> TokenFile {
        let header = read_token(path).unwrap_or_else(|e| {
            tracing::warn!(path = %path.display(), "sending the kubeconfig's token until the token file can be read: {e}");
            token
        });
        TokenFile::with(path, header)
    }

    fn with(path: &Path, header: HeaderValue) -> TokenFile {
        let cached = Cached { header, read_at: Instant::now(), reading: false };
        TokenFile { path: path.to_owned(), state: Arc::new(Mutex::new(cached)) }
    }

    /// The current `Authorization` header; starts a re-read of the file when one is due.
    pub fn header(&self) -> HeaderValue {
        let now = Instant::now();
        let mut st = self.state.lock();
        if !st.reading && now.duration_since(st.read_at) >= TOKEN_REFRESH {
            st.read_at = now;
            st.reading = true;
            let (path, state) = (self.path.clone(), self.state.clone());
            // A thread of its own, not the runtime's blocking pool: a read that never returns
            // must not hold the runtime's shutdown (which waits for its blocking tasks).
            let spawned = std::thread::Builder::new().name("token-file".into()).spawn(move || {
                let read = read_token(&path);
                let mut st = state.lock();
                st.reading = false;
                keep(&mut st, read, &path);
            });
            if let Err(e) = spawned {
                st.reading = false;
                tracing::warn!(path = %self.path.display(), "keeping the previous token: no thread to read it: {e}");
            }
        }
        st.header.clone()
    }
}

/// A re-read's token, or the previous one kept with a warning.
fn keep(st: &mut Cached, read: Result<HeaderValue, String>, path: &Path) {
    match read {
        Ok(h) => st.header = h,
        Err(e) => tracing::warn!(path = %path.display(), "keeping the previous token: {e}"),
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    bearer(&text)
}

/// Credentials from an exec plugin: the first answer (obtained at start), then a task that runs
/// the plugin again at [`renew_at`], or when the upstream answered the current credential 401,
/// and swaps the new token (and certificate) in. A failed renewal keeps the current credential,
/// says why in the log (with the plugin's stderr) and is retried every [`EXEC_RETRY`]; an
/// expired token is still sent, so the upstream's 401 shows.
pub struct ExecAuth {
    plugin: ExecPlugin,
    state: Arc<Mutex<ExecState>>,
    /// Told by [`ExecAuth::unauthorized`]; the renewal task runs the plugin then.
    refused: Arc<tokio::sync::Notify>,
    /// The TLS layer's client certificate, when the plugin returns one (set by `client.rs`).
    identity: OnceLock<Arc<IdentitySlot>>,
    task: OnceLock<tokio::task::JoinHandle<()>>,
}

struct ExecState {
    header: Option<HeaderValue>,
    /// The token the upstream refused (401), while it is the current one: the renewal task
    /// runs the plugin only if it still is when it wakes (client-go's `maybeRefreshCreds`
    /// under its lock; a review: a 401 to the old token during a renewal renewed again).
    refused: Option<Option<HeaderValue>>,
    renew_at: Option<SystemTime>,
    /// How many times the plugin answered (for tests and the log).
    runs: u64,
}

/// A failed renewal is tried again after this long.
pub(crate) const EXEC_RETRY: Duration = Duration::from_secs(5);
/// Never two runs closer than this, whatever the expiry says.
const EXEC_MIN_INTERVAL: Duration = Duration::from_secs(1);

impl ExecAuth {
    /// From the plugin's first answer (the caller ran it, so that a start fails with its
    /// message).
    pub(crate) fn new(plugin: ExecPlugin, first: &Credential) -> Result<ExecAuth, String> {
        let header = first.token.as_deref().map(bearer).transpose()?;
        let state =
            ExecState { header, refused: None, renew_at: renew_at(SystemTime::now(), first.expiry), runs: 1 };
        Ok(ExecAuth {
            plugin,
            state: Arc::new(Mutex::new(state)),
            refused: Arc::new(tokio::sync::Notify::new()),
            identity: OnceLock::new(),
            task: OnceLock::new(),
        })
    }

    /// Where a renewed client certificate goes.
    pub fn set_identity_slot(&self, slot: Arc<IdentitySlot>) {
        let _ = self.identity.set(slot);
    }

    /// The current token; starts the renewal task on first use inside a runtime.
    pub fn header(&self) -> Option<HeaderValue> {
        if self.task.get().is_none() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                let _ = self.task.get_or_init(|| {
                    let (plugin, state, refused) =
                        (self.plugin.clone(), self.state.clone(), self.refused.clone());
                    rt.spawn(renew(plugin, state, refused, self.identity.get().cloned()))
                });
            }
        }
        self.state.lock().header.clone()
    }

    /// [`Credentials::unauthorized`]: only a refusal of the current token renews it (the
    /// answers to requests sent before a renewal do not renew it again).
    fn unauthorized(&self, sent: Option<&HeaderValue>) {
        let mut st = self.state.lock();
        if st.header.as_ref() == sent {
            st.refused = Some(sent.cloned());
            self.refused.notify_one();
        }
    }

    /// How many times the plugin has answered.
    #[cfg(test)]
    pub fn runs(&self) -> u64 {
        self.state.lock().runs
    }
}

impl Drop for ExecAuth {
    fn drop(&mut self) {
        if let Some(t) = self.task.get() {
            t.abort();
        }
    }
}

async fn renew(
    plugin: ExecPlugin,
    state: Arc<Mutex<ExecState>>,
    refused: Arc<tokio::sync::Notify>,
    identity: Option<Arc<IdentitySlot>>,
) {
    let mut last_run = Instant::now();
    loop {
        let due = state.lock().renew_at;
        let at_expiry = async {
            match due {
                Some(at) => {
                    let wait = at.duration_since(SystemTime::now()).unwrap_or_default();
                    tokio::time::sleep_until(Instant::now() + wait).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = at_expiry => {}
            () = refused.notified() => {
                let still = {
                    let st = state.lock();
                    st.refused.as_ref().is_some_and(|r| *r == st.header)
                };
                if !still {
                    continue;
                }
                tracing::info!(user = %plugin.user, "the upstream refused the exec plugin's credential (401); running the plugin again");
                // A plugin that keeps giving a refused token is not run more often than this.
                tokio::time::sleep_until(last_run + EXEC_RETRY).await;
            }
        }
        tokio::time::sleep_until(last_run + EXEC_MIN_INTERVAL).await;
        last_run = Instant::now();
        let obtained = SystemTime::now();
        let applied = plugin.run().await.and_then(|c| {
            let header = c.token.as_deref().map(bearer).transpose()?;
            if let (Some(slot), Some((cert, key))) = (&identity, &c.identity) {
                let id = Identity::from_pem(cert, key).map_err(|e| format!("{}: {e}", plugin.describe()))?;
                slot.replace(&id).map_err(|e| format!("{}: {e}", plugin.describe()))?;
            }
            let mut st = state.lock();
            if header.is_some() {
                st.header = header;
            }
            st.refused = None;
            st.renew_at = renew_at(obtained, c.expiry);
            st.runs += 1;
            Ok(())
        });
        match applied {
            Ok(()) => tracing::debug!(user = %plugin.user, "exec plugin renewed the credential"),
            Err(e) => {
                tracing::warn!("{e}; keeping the current credential, trying again in {EXEC_RETRY:?}");
                state.lock().renew_at = Some(SystemTime::now() + EXEC_RETRY);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::testutil::TempDir;

    #[tokio::test(start_paused = true)]
    async fn token_file_is_reread_after_a_minute_and_kept_on_failure() {
        let dir = TempDir::new();
        let path = dir.write("token", "first\n");
        let f = TokenFile::open(&path).unwrap();
        assert_eq!(f.header(), "Bearer first");
        assert!(f.header().is_sensitive());

        std::fs::write(&path, "second").unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(f.header(), "Bearer first", "not due yet");
        assert!(!f.state.lock().reading);
        tokio::time::advance(Duration::from_secs(1)).await;
        f.header();
        settled(&f);
        assert_eq!(f.header(), "Bearer second");

        std::fs::remove_file(&path).unwrap();
        tokio::time::advance(TOKEN_REFRESH).await;
        f.header();
        settled(&f);
        assert_eq!(f.header(), "Bearer second", "a failed re-read keeps the old token");
    }

    /// Waits (real time, bounded) for a re-read in flight to end.
    fn settled(f: &TokenFile) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while f.state.lock().reading {
            assert!(std::time::Instant::now() < deadline, "the re-read never ended");
            std::thread::yield_now();
        }
    }

    /// A token file whose read hangs (a FIFO with no writer stands for a hung NFS mount): the
    /// proxy's requests keep the current token meanwhile, no second read piles up, and the
    /// token read once the file answers is used.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_token_file_never_stalls_a_request() {
        let dir = TempDir::new();
        let path = dir.write("token", "first");
        let f = TokenFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let fifo = std::process::Command::new("mkfifo").arg(&path).status();
        assert!(fifo.is_ok_and(|s| s.success()), "mkfifo (coreutils) makes the FIFO");

        // The writer answers when told, or after 10 s: then a read made inline would have
        // waited that long and returned the new token below instead of the current one.
        let (go, told) = std::sync::mpsc::channel::<()>();
        let p = path.clone();
        let writer = std::thread::spawn(move || {
            let _ = told.recv_timeout(Duration::from_secs(10));
            std::fs::write(p, "third").unwrap();
        });

        tokio::time::advance(TOKEN_REFRESH).await;
        assert_eq!(f.header(), "Bearer first", "sent while the file hangs");
        assert!(f.state.lock().reading, "the re-read runs aside");
        tokio::time::advance(TOKEN_REFRESH * 3).await;
        assert_eq!(f.header(), "Bearer first", "one re-read at a time, the request not held");

        // (The writer may have answered already, its 10 s up on a loaded machine.)
        let _ = go.send(());
        writer.join().unwrap();
        settled(&f);
        // Due again (the clock moved 4 minutes): this call starts a read that hangs for ever (no
        // writer now). The runtime's shutdown at the end of the test must not wait for it (on
        // the runtime's blocking pool it did: the process never exited).
        assert_eq!(f.header(), "Bearer third");
        assert!(f.state.lock().reading);
    }

    #[test]
    fn missing_or_empty_token_file_is_a_one_line_config_error() {
        let dir = TempDir::new();
        let e = TokenFile::open(&dir.path().join("absent")).err().unwrap().to_string();
        assert!(e.starts_with("cannot read token file "), "{e}");
        assert!(!e.contains('\n'));
        let empty = dir.write("empty", "  \n");
        let e = TokenFile::open(&empty).err().unwrap().to_string();
        assert!(e.ends_with("the token is empty"), "{e}");
    }

    #[test]
    fn describe_never_shows_the_token() {
        let a = Credentials::token("s3cret").unwrap();
        assert_eq!(a.header().unwrap(), "Bearer s3cret");
        assert!(!a.describe().contains("s3cret"));
        assert!(Credentials::token("a\nb").is_err());
    }
}
