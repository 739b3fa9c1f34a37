#![no_main]
//! Any bytes as a `/gpux/ledger/2` frame, request and answer (the ledger's request-response codec).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpux_protocol::fuzzing::ledger_wire(data);
});
