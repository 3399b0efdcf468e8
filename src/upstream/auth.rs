//! The proxy's own credentials at the HTTP layer: a bearer token, or a token file re-read every
//! minute (bound service-account tokens rotate, and kube-client's config loader does not refresh
//! them). Client certificates live at the TLS layer (`tls.rs`).
//!
//! Used by `client.rs` on the proxy's own requests only; forwarded requests never see these.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::HeaderValue;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::errors::ConfigError;

/// How often a token file is read again.
pub(crate) const TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// The proxy's bearer credentials.
pub(crate) enum Auth {
    None,
    /// A fixed token (kubeconfig `token`). The header value is marked sensitive.
    Token(HeaderValue),
    TokenFile(TokenFile),
}

impl Auth {
    /// A fixed bearer token.
    pub fn token(token: &str) -> Result<Auth, String> {
        bearer(token).map(Auth::Token)
    }

    /// The `Authorization` header to send, if any.
    pub fn header(&self) -> Option<HeaderValue> {
        match self {
            Auth::None => None,
            Auth::Token(h) => Some(h.clone()),
            Auth::TokenFile(f) => Some(f.header()),
        }
    }

    /// For the startup log; never the token itself.
    pub fn describe(&self) -> String {
        match self {
            Auth::None => "no bearer token".into(),
            Auth::Token(_) => "bearer token".into(),
            Auth::TokenFile(f) => format!("bearer token from {}", f.path.display()),
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

/// A token file, read at start (a missing or empty file is a configuration error) and again on
/// use once [`TOKEN_REFRESH`] has passed. A failed re-read keeps the previous token.
pub(crate) struct TokenFile {
    path: PathBuf,
    state: Mutex<Cached>,
}

struct Cached {
    header: HeaderValue,
    read_at: Instant,
}

impl TokenFile {
    pub fn open(path: &Path) -> Result<TokenFile, ConfigError> {
        let header = read_token(path).map_err(|e| ConfigError::read_file("token file", path, e))?;
        Ok(TokenFile { path: path.to_owned(), state: Mutex::new(Cached { header, read_at: Instant::now() }) })
    }

    /// The current `Authorization` header, re-reading the file when it is due.
    pub fn header(&self) -> HeaderValue {
        let now = Instant::now();
        let mut st = self.state.lock();
        if now.duration_since(st.read_at) >= TOKEN_REFRESH {
            // A tiny file, once a minute: reading it inline is cheaper than a task.
            match read_token(&self.path) {
                Ok(h) => st.header = h,
                Err(e) => tracing::warn!(path = %self.path.display(), "keeping the previous token: {e}"),
            }
            st.read_at = now;
        }
        st.header.clone()
    }
}

fn read_token(path: &Path) -> Result<HeaderValue, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    bearer(&text)
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
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.header(), "Bearer second");

        std::fs::remove_file(&path).unwrap();
        tokio::time::advance(TOKEN_REFRESH).await;
        assert_eq!(f.header(), "Bearer second", "a failed re-read keeps the old token");
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
        let a = Auth::token("s3cret").unwrap();
        assert_eq!(a.header().unwrap(), "Bearer s3cret");
        assert!(!a.describe().contains("s3cret"));
        assert!(Auth::token("a\nb").is_err());
    }
}
