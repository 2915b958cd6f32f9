#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ringway::fuzzing::response_head(data));
