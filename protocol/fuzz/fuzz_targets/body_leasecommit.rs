#![no_main]
//! Any bytes as the body of a `LeaseCommit` envelope (the signature is skipped so the decoder is reached).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpux_protocol::fuzzing::body::<gpux_protocol::LeaseCommit>(data);
});
