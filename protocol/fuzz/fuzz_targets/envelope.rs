#![no_main]
//! Any bytes as an envelope of any kind: framing, body decoding, verification.
libfuzzer_sys::fuzz_target!(|data: &[u8]| gpux_protocol::fuzzing::envelope(data));
