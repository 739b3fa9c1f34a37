//! The gpux local testnet.
//!
//! **Status: empty.** `gpux testnet up`, which starts hosts, renters and a ledger as separate
//! processes on loopback and reports on the run, arrives with the node issue; until then this
//! crate exports nothing and the `gpux` binary has no `testnet` command.
