//! Replays the committed fuzz corpus of the query parser (`market/fuzz/corpus/query/`): CI
//! re-checks everything the fuzzer found without fuzzing.

use std::path::Path;

use gpux_market::query::Query;
use gpux_market::{BookConfig, OrderBook};

use crate::common::*;

#[test]
fn query_corpus_replays_without_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/query");
    let mut book = OrderBook::new(BookConfig::default());
    book.insert(&O::default().sign(), T0).unwrap();
    let (mut replayed, mut parsed) = (0, 0);
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        replayed += 1;
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        if let Ok(query) = Query::parse(text) {
            parsed += 1;
            assert!(book.search(&query, T0, 5).len() <= 1);
        }
    }
    assert!(replayed > 0, "empty corpus");
    assert!(parsed > 0, "no input in the corpus parses");
}
