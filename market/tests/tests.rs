//! gpux-market integration tests.
#![allow(clippy::unwrap_used, missing_docs, unreachable_pub, dead_code)]

mod book;
mod common;
mod fuzz_corpus;
mod ledger;
mod props;
