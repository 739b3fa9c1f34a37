//! The gpux market engine: the query language, the order book, matching, the settlement
//! ledger and reputation. Pure: no async code, no clock, no I/O. Time comes in as an argument.
//!
//! ```
//! use gpux_market::query::Query;
//!
//! let query = Query::parse("gpu=H100 vram>=80 count>=2 price<=2.5 region=eu")?;
//! assert_eq!(query.clauses.len(), 5);
//! let typo = Query::parse("gpu=H100 vrma>=80").unwrap_err();
//! assert_eq!(typo.to_string(), "unknown field 'vrma' at column 10; did you mean 'vram'?");
//! # Ok::<(), gpux_market::query::QueryError>(())
//! ```

pub mod query;

pub mod book;

pub use book::{
    Allocation, BidError, BidSpec, BookConfig, Hit, InsertError, Inserted, MatchError, OrderBook,
    ReserveError, WithdrawError,
};
pub mod estimate;
pub mod ledger;
pub mod reputation;

pub use ledger::{Applied, Escrow, Ledger, LedgerConfig, LedgerError, LedgerOp};
pub use reputation::{HostEvent, Reputation, ReputationConfig};
