#![no_main]
//! Any bytes as the body of a `PreemptionNotice` envelope (the signature is skipped so the decoder is reached).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    gpux_protocol::fuzzing::body::<gpux_protocol::PreemptionNotice>(data);
});
