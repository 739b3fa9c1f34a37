//! The gpux market engine.
//!
//! **Status: empty.** The query language, order book, matching, settlement ledger and
//! reputation arrive with the market-engine issue; until then this crate exports nothing,
//! so no caller can mistake it for working code. It will depend only on `gpux-protocol` and
//! stay free of async code, clocks and I/O: time comes in as an argument.
