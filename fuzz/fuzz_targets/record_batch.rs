//! Fuzz `kafkapipe::record::decode_batches` (the `records` bytes of a fetch response):
//! it must never panic, and what it decodes must be internally consistent.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let input = Bytes::copy_from_slice(data);
    if let Ok(decoded) = kafkapipe::record::decode_batches(input, 1 << 20) {
        if decoded.truncated_batch_size.is_some() {
            assert!(decoded.truncated);
        }
        for batch in &decoded.batches {
            let _ = batch.control_record();
            let _ = batch.next_offset();
        }
    }
});
