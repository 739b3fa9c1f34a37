//! The console's sign-ins: one-time login links, sessions with their anti-forgery tokens,
//! and where the console is served.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpux_api::{ApiError, ConsoleLogin, ErrorCode};
use tokio::sync::mpsc;

use super::history::History;
use crate::daemon::http::same;

/// How long a login link stays usable.
const LOGIN_TTL: Duration = Duration::from_secs(120);
/// How long a session lasts.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Login links waiting to be opened, at most.
const MAX_LOGINS: usize = 16;
/// Sessions at once, at most (the oldest goes first).
const MAX_SESSIONS: usize = 32;
/// The session cookie's name, before the port: cookies are kept by host name, not port, so
/// each node on a machine (a testnet's) names its own and signing into one keeps the others.
const COOKIE: &str = "gpux_console_";

/// One browser signed in.
struct Session {
    /// The anti-forgery token its forms carry.
    csrf: String,
    expires: Instant,
}

#[derive(Default)]
struct Sessions {
    /// Login secrets not used yet, with when they lapse.
    logins: BTreeMap<String, Instant>,
    sessions: BTreeMap<String, Session>,
}

impl Sessions {
    fn prune(&mut self, now: Instant) {
        self.logins.retain(|_, lapses| *lapses > now);
        self.sessions.retain(|_, s| s.expires > now);
    }
}

/// What the console reads besides the API's commands.
pub(crate) struct Feeds {
    /// Asks the loop for what `/metrics` shows (the host's GPUs).
    pub(crate) snapshots: mpsc::Sender<crate::metrics::SnapshotRequest>,
    /// The host's GPU utilisation over the last hour.
    pub(crate) history: History,
}

/// The console's sessions and where it is served.
#[derive(Clone)]
pub(crate) struct Console {
    addr: SocketAddr,
    sessions: Arc<Mutex<Sessions>>,
    /// A host's GPU utilisation over the last hour.
    pub(super) history: History,
}

fn secret() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(gpux_protocol::hex(&bytes))
}

impl Console {
    pub(crate) fn new(addr: SocketAddr, history: History) -> Self {
        Self {
            addr,
            sessions: Arc::default(),
            history,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sessions> {
        // A panic elsewhere while holding it leaves nothing half-written worth refusing.
        self.sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A one-time login link (for `gpux console`).
    pub(crate) fn issue_login(&self) -> Result<ConsoleLogin, ApiError> {
        let once = secret()?;
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.prune(now);
        if sessions.logins.len() >= MAX_LOGINS {
            return Err(ApiError::new(
                ErrorCode::Conflict,
                "too many console login links are waiting to be opened",
            )
            .with_hint("open one of them, or wait two minutes for them to lapse"));
        }
        sessions.logins.insert(once.clone(), now + LOGIN_TTL);
        Ok(ConsoleLogin {
            url: format!("http://{}/console/login?once={once}", self.addr),
            expires_in_s: LOGIN_TTL.as_secs(),
        })
    }

    /// Spends a login secret for a new session: (session id, its token).
    pub(super) fn open_session(&self, once: &str) -> Option<(String, String)> {
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.prune(now);
        let key = sessions
            .logins
            .keys()
            .find(|k| same(k.as_bytes(), once.as_bytes()))?
            .clone();
        sessions.logins.remove(&key);
        let (id, csrf) = (secret().ok()?, secret().ok()?);
        if sessions.sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                sessions.sessions.remove(&oldest);
            }
        }
        sessions.sessions.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + SESSION_TTL,
            },
        );
        Some((id, csrf))
    }

    /// The anti-forgery token of a live session.
    pub(super) fn session(&self, id: &str) -> Option<String> {
        let now = Instant::now();
        let mut sessions = self.lock();
        sessions.prune(now);
        sessions
            .sessions
            .iter()
            .find(|(k, _)| same(k.as_bytes(), id.as_bytes()))
            .map(|(_, s)| s.csrf.clone())
    }

    pub(super) fn end_session(&self, id: &str) {
        self.lock().sessions.remove(id);
    }

    /// This console's session cookie's name.
    pub(super) fn cookie_name(&self) -> String {
        format!("{COOKIE}{}", self.addr.port())
    }

    /// Whether `host` (a `Host` header) names this console's own address.
    pub(super) fn is_own_host(&self, host: &str) -> bool {
        let port = self.addr.port();
        [
            self.addr.to_string(),
            format!("localhost:{port}"),
            format!("127.0.0.1:{port}"),
            format!("[::1]:{port}"),
        ]
        .iter()
        .any(|h| h.eq_ignore_ascii_case(host))
    }

    /// Whether `origin` (an `Origin` header) is this console's own.
    pub(super) fn is_own_origin(&self, origin: &str) -> bool {
        origin
            .strip_prefix("http://")
            .is_some_and(|host| self.is_own_host(host))
    }
}
