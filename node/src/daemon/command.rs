//! What the local API asks of the daemon's loop ([`ApiCommand`], each with the channel its
//! answer goes back on), and the state every HTTP handler shares ([`AppState`]): the API's
//! routes and the console's both use them.

use gpux_api::{
    ApiError, Balance, BidPlaced, BidRequest, BlockRequest, Blocked, ErrorCode, LeaseView,
    LedgerTotals, LogsPage, MintRequest, Minted, OfferHit, Receipts, RentRequest, Rented,
    ShuttingDown, Status, Stopping,
};
use tokio::sync::{mpsc, oneshot};

use super::console::sessions::Console;
use crate::plane::bridge::Bridge;

/// Where the answer to an API command goes.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, ApiError>>;

/// What the API asks of the node.
pub(crate) enum ApiCommand {
    Status {
        reply: Reply<Status>,
    },
    Search {
        query: String,
        limit: usize,
        reply: Reply<Vec<OfferHit>>,
    },
    Leases {
        reply: Reply<Vec<LeaseView>>,
    },
    Rent {
        request: Box<RentRequest>,
        reply: Reply<Rented>,
    },
    RentProgress {
        name: String,
        reply: Reply<gpux_api::RentProgress>,
    },
    Group {
        request: Box<RentRequest>,
        reply: Reply<gpux_api::GroupPlaced>,
    },
    ScaleGroup {
        group: String,
        delta: i32,
        reply: Reply<gpux_api::GroupScaled>,
    },
    Bids {
        reply: Reply<Vec<gpux_api::BidView>>,
    },
    CancelBid {
        bid: String,
        reply: Reply<gpux_api::BidView>,
    },
    Bid {
        request: Box<BidRequest>,
        reply: Reply<BidPlaced>,
    },
    Logs {
        lease: String,
        from: u64,
        reply: Reply<LogsPage>,
    },
    Receipts {
        lease: String,
        reply: Reply<Receipts>,
    },
    Stop {
        lease: String,
        reply: Reply<Stopping>,
    },
    Commit {
        lease: String,
        reply: Reply<gpux_api::Committed>,
    },
    Challenge {
        lease: String,
        reply: Reply<gpux_api::ChallengePassed>,
    },
    Balance {
        reply: Reply<Balance>,
    },
    Mint {
        request: MintRequest,
        reply: Reply<Minted>,
    },
    Ledger {
        reply: Reply<LedgerTotals>,
    },
    LedgerReadd {
        request: gpux_api::ReaddRequest,
        reply: Reply<gpux_api::Readded>,
    },
    Block {
        request: BlockRequest,
        reply: Reply<Blocked>,
    },
    Follow {
        request: gpux_api::FollowRequest,
        reply: Reply<gpux_api::Following>,
    },
    Settings {
        /// None: only read them.
        change: Option<gpux_api::SettingChange>,
        reply: Reply<gpux_api::Settings>,
    },
    Shutdown {
        /// End the hosted leases first (otherwise they keep running for the next start).
        end_leases: bool,
        reply: Reply<ShuttingDown>,
    },
}

#[derive(Clone)]
pub(crate) struct AppState {
    pub(super) token: String,
    pub(super) commands: mpsc::Sender<ApiCommand>,
    pub(super) bridge: Bridge,
    /// The web console's sessions.
    pub(crate) console: Console,
    /// Asks the loop for what `/metrics` shows (the console's host view).
    pub(crate) snapshots: mpsc::Sender<crate::metrics::SnapshotRequest>,
}

/// The answer when the loop has stopped.
fn stopping() -> ApiError {
    ApiError::new(ErrorCode::Unavailable, "the node is shutting down")
}

/// Asks the loop and waits for its answer.
pub(crate) async fn call<T>(
    state: &AppState,
    make: impl FnOnce(Reply<T>) -> ApiCommand,
) -> Result<T, ApiError> {
    let (reply, rx) = oneshot::channel();
    if state.commands.send(make(reply)).await.is_err() {
        return Err(stopping());
    }
    rx.await.unwrap_or_else(|_| Err(stopping()))
}
