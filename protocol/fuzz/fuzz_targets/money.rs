#![no_main]
//! Any bytes as money text: parsing, and printing back what parsed.
libfuzzer_sys::fuzz_target!(|data: &[u8]| gpux_protocol::fuzzing::money(data));
