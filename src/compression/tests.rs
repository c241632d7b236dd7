use super::*;
use crate::ErrorKind;
use proptest::prelude::*;

fn roundtrip(c: Compression, data: &[u8]) -> Bytes {
    let mut out = BytesMut::new();
    c.compress(data, &mut out).unwrap();
    c.decompress(&out, data.len()).unwrap()
}

#[test]
fn codes_roundtrip() {
    for c in Compression::ALL {
        assert_eq!(Compression::from_code(c.code()).unwrap(), c);
        assert_eq!(Compression::from_attributes(c.code() | 0x30).unwrap(), c);
        assert_eq!(c.name().parse::<Compression>().unwrap(), c);
        assert!(c.is_available());
    }
    assert!(Compression::from_attributes(5).is_err());
    assert!(Compression::from_attributes(7).is_err());
    assert!("brotli".parse::<Compression>().is_err());
}

#[test]
fn every_codec_roundtrips_empty_small_and_multiblock() {
    let big: Vec<u8> = (0..200_000u32)
        .map(|i| (i % 251) as u8 ^ (i >> 9) as u8)
        .collect();
    for c in Compression::ALL {
        for data in [&b""[..], b"hello kafka", &big[..]] {
            assert_eq!(&roundtrip(c, data)[..], data, "{c}");
        }
    }
}

#[test]
fn xerial_snappy_layout_matches_java() {
    let data = vec![7u8; 70_000]; // three 32 KiB blocks
    let mut out = BytesMut::new();
    Compression::Snappy.compress(&data, &mut out).unwrap();
    assert_eq!(&out[..8], b"\x82SNAPPY\0");
    assert_eq!(&out[8..16], &[0, 0, 0, 1, 0, 0, 0, 1]);
    // walk the blocks
    let mut rest = &out[16..];
    let mut blocks = 0;
    let mut total = 0;
    while !rest.is_empty() {
        let len = i32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
        let block = &rest[4..4 + len];
        let n = snap::raw::decompress_len(block).unwrap();
        assert!(n <= 32 * 1024);
        total += n;
        blocks += 1;
        rest = &rest[4 + len..];
    }
    assert_eq!(blocks, 3);
    assert_eq!(total, data.len());
}

#[test]
fn raw_snappy_is_read() {
    let data = b"raw snappy as some producers write it".repeat(10);
    let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
    let got = Compression::Snappy.decompress(&raw, 1 << 20).unwrap();
    assert_eq!(&got[..], &data[..]);
    // the declared size is checked before allocating
    let err = Compression::Snappy.decompress(&raw, 10).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Compression);
}

#[test]
fn zip_bombs_are_bounded() {
    let zeros = vec![0u8; 10 << 20];
    for c in Compression::ALL {
        let mut out = BytesMut::new();
        c.compress(&zeros, &mut out).unwrap();
        let err = c.decompress(&out, 1 << 20).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Compression, "{c}: {err}");
        assert!(err.to_string().contains("limit"), "{c}: {err}");
        // exactly at the limit is fine
        assert_eq!(c.decompress(&out, zeros.len()).unwrap().len(), zeros.len());
    }
}

#[test]
fn corrupt_and_truncated_input_is_an_error() {
    let data = b"some payload that compresses, some payload that compresses".repeat(50);
    for c in Compression::ALL.into_iter().skip(1) {
        let mut out = BytesMut::new();
        c.compress(&data, &mut out).unwrap();
        let truncated = &out[..out.len() / 2];
        assert!(c.decompress(truncated, 1 << 20).is_err(), "{c} truncated");
        let garbage = vec![0xa5u8; 64];
        assert!(c.decompress(&garbage, 1 << 20).is_err(), "{c} garbage");
    }
    // a xerial header whose block length overruns
    let mut x = b"\x82SNAPPY\0\0\0\0\x01\0\0\0\x01".to_vec();
    x.extend_from_slice(&[0, 0, 1, 0, 1, 2]);
    assert!(Compression::Snappy.decompress(&x, 1 << 20).is_err());
}

proptest! {
    #[test]
    fn roundtrip_arbitrary(data: Vec<u8>) {
        for c in Compression::ALL {
            prop_assert_eq!(&roundtrip(c, &data)[..], &data[..]);
        }
    }

    #[test]
    fn arbitrary_input_never_panics(data: Vec<u8>, max in 0usize..100_000) {
        for c in Compression::ALL {
            let _ = c.decompress(&data, max);
        }
        let mut x = b"\x82SNAPPY\0".to_vec();
        x.extend_from_slice(&data);
        let _ = Compression::Snappy.decompress(&x, max);
    }
}

/// With a pool, each codec decompresses into a pooled buffer that comes back once the last
/// slice of the output is dropped, and the next payload reuses it; output over the limit
/// gives its buffer back too.
#[test]
fn pooled_decompression_reuses_its_buffers() {
    use crate::bufpool::BufPool;
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 13) as u8).collect();
    for c in [Compression::Gzip, Compression::Lz4, Compression::Zstd] {
        let pool = BufPool::new(4, 1 << 20, 4 << 20);
        let mut packed = BytesMut::new();
        c.compress(&input, &mut packed).unwrap();
        let out = c
            .decompress_pooled(&packed, 1 << 20, Some(&pool))
            .unwrap()
            .unwrap();
        assert_eq!(&out[..], &input[..], "{c}");
        let ptr = out.as_ptr();
        let slice = out.slice(100..200);
        drop(out);
        assert_eq!(pool.kept().0, 0, "{c}: a slice still holds the buffer");
        drop(slice);
        assert_eq!(pool.kept().0, 1, "{c}");
        let again = c
            .decompress_pooled(&packed, 1 << 20, Some(&pool))
            .unwrap()
            .unwrap();
        assert_eq!(again.as_ptr(), ptr, "{c}: the buffer is reused");
        drop(again);
        assert!(c
            .decompress_pooled(&packed, 1000, Some(&pool))
            .unwrap()
            .is_none());
        assert_eq!(
            pool.kept().0,
            1,
            "{c}: over the limit, the buffer came back"
        );
    }
}

/// zstd payloads that declare their size take the one-shot path, those that do not (or hold
/// several frames) the streaming one; both give the same bytes and respect the limit.
#[test]
fn zstd_sized_and_streamed_payloads_decode_within_the_limit() {
    use std::io::Write;
    let input: Vec<u8> = (0..300_000u32).map(|i| (i % 29) as u8).collect();
    let mut sized = BytesMut::new();
    Compression::Zstd.compress(&input, &mut sized).unwrap();
    assert_eq!(
        zstd::zstd_safe::get_frame_content_size(&sized).unwrap(),
        Some(input.len() as u64)
    );
    // Streamed without a pledged size: no content size in the frame header.
    let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    enc.write_all(&input).unwrap();
    let unsized_ = enc.finish().unwrap();
    assert_eq!(
        zstd::zstd_safe::get_frame_content_size(&unsized_).unwrap(),
        None
    );
    // Two frames back to back, the first declaring only its own size.
    let mut two = sized.to_vec();
    two.extend_from_slice(&sized);
    let twice: Vec<u8> = [&input[..], &input[..]].concat();
    let pool = crate::bufpool::BufPool::new(4, 4 << 20, 8 << 20);
    for p in [None, Some(&pool)] {
        for (payload, expected) in [
            (&sized[..], &input),
            (&unsized_[..], &input),
            (&two[..], &twice),
        ] {
            let out = Compression::Zstd
                .decompress_pooled(payload, 1 << 20, p)
                .unwrap()
                .unwrap();
            assert_eq!(&out[..], &expected[..]);
            let limit = expected.len() - 1;
            assert!(Compression::Zstd
                .decompress_pooled(payload, limit, p)
                .unwrap()
                .is_none());
        }
        // Cut short: the one-shot path fails, and so does the streaming one, as an error.
        assert!(Compression::Zstd
            .decompress_pooled(&sized[..sized.len() / 2], 1 << 20, p)
            .is_err());
    }
}

/// A 20-byte zstd frame may declare hundreds of MiB: the one-shot path must not allocate
/// what the header says before anything decompressed (an allocation that size aborts the
/// process where memory is not overcommitted); the frame streams instead and fails as an
/// error.
#[cfg(feature = "zstd")]
#[test]
fn a_zstd_header_declaring_a_huge_size_is_not_trusted_for_allocation() {
    let declared: u64 = 200 << 20;
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0xE0]; // magic; single segment, 8-byte size
    frame.extend_from_slice(&declared.to_le_bytes());
    frame.extend_from_slice(&[0x01, 0x00, 0x00]); // a raw block header, then no data
    assert_eq!(
        zstd::zstd_safe::get_frame_content_size(&frame).unwrap(),
        Some(declared)
    );
    assert!(super::one_shot_limit(frame.len()) < declared as usize);
    assert!(super::zstd_decompress_sized(&frame, 1 << 30, None).is_none());
    assert!(Compression::Zstd
        .decompress_pooled(&frame, 1 << 30, None)
        .is_err());
    // A plausible declared size (a real payload) still takes the one-shot path.
    let input = vec![7u8; 100_000];
    let mut sized = BytesMut::new();
    Compression::Zstd.compress(&input, &mut sized).unwrap();
    assert!(super::one_shot_limit(sized.len()) >= input.len());
    let out = super::zstd_decompress_sized(&sized, 1 << 20, None);
    assert!(matches!(out, Some(Ok(Some(ref b))) if b[..] == input[..]));
}

/// zstd compresses with one reused context per thread: consecutive payloads (of other
/// sizes between them) each come out as one frame declaring its content size that decodes
/// back, as does the streaming fallback's.
#[cfg(feature = "zstd")]
#[test]
fn zstd_reuses_its_context_and_matches_the_streaming_encoder() {
    for (i, len) in [100_000usize, 10, 1 << 20, 0, 100_000]
        .into_iter()
        .enumerate()
    {
        let input: Vec<u8> = (0..len)
            .map(|j| ((j / 7) as u8).wrapping_add(i as u8))
            .collect();
        let mut reused = BytesMut::new();
        super::zstd_compress(&input, &mut reused).unwrap();
        let mut streamed = BytesMut::new();
        super::zstd_compress_streaming(&input, &mut streamed).unwrap();
        for frame in [&reused, &streamed] {
            assert_eq!(
                zstd::zstd_safe::get_frame_content_size(frame).unwrap(),
                Some(len as u64)
            );
            let back = Compression::Zstd.decompress(frame, len).unwrap();
            assert!(back[..] == input[..], "payload {i} of {len} bytes");
        }
    }
}

/// An LZ4 frame written with `info` by `lz4_flex`'s frame encoder.
fn lz4_frame(data: &[u8], info: lz4_flex::frame::FrameInfo) -> Vec<u8> {
    use std::io::Write;
    let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(info, Vec::new());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

/// Every layout of frame the LZ4 frame format allows a Kafka producer to write: block
/// sizes, linked or independent blocks, block and content checksums, a declared content
/// size; compressible and incompressible (stored) blocks.
fn lz4_frame_infos() -> Vec<lz4_flex::frame::FrameInfo> {
    use lz4_flex::frame::{BlockMode, BlockSize, FrameInfo};
    let mut infos = Vec::new();
    for size in [
        BlockSize::Max64KB,
        BlockSize::Max256KB,
        BlockSize::Max1MB,
        BlockSize::Max4MB,
    ] {
        for mode in [BlockMode::Independent, BlockMode::Linked] {
            for (block_sums, content_sum, declared) in [
                (false, false, false),
                (true, false, false),
                (false, true, false),
                (true, true, true),
            ] {
                infos.push(
                    FrameInfo::new()
                        .block_size(size)
                        .block_mode(mode)
                        .block_checksums(block_sums)
                        .content_checksum(content_sum)
                        .content_size(declared.then_some(0)),
                );
            }
        }
    }
    infos
}

fn mixed_payload(len: usize) -> Vec<u8> {
    // compressible stretches and incompressible ones (which LZ4 stores uncompressed)
    let noise = crate::util::noise(len, 7);
    (0..len)
        .map(|i| {
            if (i / 50_000) % 2 == 0 {
                (i % 31) as u8
            } else {
                noise[i]
            }
        })
        .collect()
}

#[test]
fn lz4_frames_of_every_layout_decode_and_respect_the_limit() {
    use crate::bufpool::BufPool;
    for len in [0, 1, 70_000, 300_000] {
        let data = mixed_payload(len);
        for info in lz4_frame_infos() {
            let mut info = info;
            if info.content_size.is_some() {
                info.content_size = Some(len as u64);
            }
            let frame = lz4_frame(&data, info.clone());
            let pool = BufPool::new(4, 8 << 20, 16 << 20);
            for p in [None, Some(&pool)] {
                let got = Compression::Lz4.decompress_pooled(&frame, len, p).unwrap();
                assert_eq!(got.as_deref(), Some(&data[..]), "{info:?} len {len}");
                if len > 0 {
                    let over = Compression::Lz4.decompress_pooled(&frame, len - 1, p);
                    assert!(matches!(over, Ok(None)), "{info:?} len {len}: {over:?}");
                }
            }
        }
    }
}

/// A frame whose block or content checksum, header checksum or block data is damaged is an
/// error (the record batch CRC would normally catch it first; the frame is checked anyway).
#[test]
fn damaged_lz4_frames_are_errors() {
    use lz4_flex::frame::FrameInfo;
    let data = mixed_payload(150_000);
    let info = FrameInfo::new()
        .block_checksums(true)
        .content_checksum(true);
    let frame = lz4_frame(&data, info);
    // header checksum (byte 6), the first block's data, the last bytes (content checksum)
    for at in [6, 12, frame.len() - 1] {
        let mut bad = frame.clone();
        bad[at] ^= 0x40;
        let got = Compression::Lz4.decompress(&bad, 1 << 20);
        assert!(got.is_err(), "byte {at}: {got:?}");
    }
    // each checksum on its own catches a changed literal in the first block
    for info in [
        FrameInfo::new().block_checksums(true),
        FrameInfo::new().content_checksum(true),
    ] {
        let mut bad = lz4_frame(&data, info.clone());
        bad[20] ^= 0x01; // a literal (bytes 11 and 12: the token and its length)
        let got = Compression::Lz4.decompress(&bad, 1 << 20);
        assert!(got.is_err(), "{info:?}: {got:?}");
    }
}

/// An LZ4 payload is decoded into one buffer sized from the frame's block headers: it is
/// not grown by doubling on the way, which allocates and faults in up to twice the memory.
#[test]
fn lz4_output_takes_one_buffer_sized_from_its_blocks() {
    use crate::bufpool::BufPool;
    let data: Vec<u8> = (0..1_100_000u32).map(|i| (i % 13) as u8).collect();
    let mut packed = BytesMut::new();
    Compression::Lz4.compress(&data, &mut packed).unwrap();
    let pool = BufPool::new(4, 8 << 20, 16 << 20);
    let out = Compression::Lz4
        .decompress_pooled(&packed, 4 << 20, Some(&pool))
        .unwrap()
        .unwrap();
    assert_eq!(&out[..], &data[..]);
    drop(out);
    let (n, capacity) = pool.kept();
    assert_eq!(n, 1);
    assert!(
        capacity <= data.len() + (64 << 10),
        "a {}-byte payload held a {capacity}-byte buffer",
        data.len()
    );
}

proptest! {
    /// The sized LZ4 decoder and the streaming one agree on every frame, damaged or not:
    /// whatever the sized one decodes, the streaming one decodes to the same bytes.
    #[test]
    fn lz4_sized_and_streaming_decoders_agree(
        data in proptest::collection::vec(0u8..4, 0..200_000),
        pick in 0usize..32,
        damage in proptest::option::of((any::<proptest::sample::Index>(), 1u8..=255)),
        limit_cut in 0usize..3,
    ) {
        let infos = lz4_frame_infos();
        let mut info = infos[pick % infos.len()].clone();
        if info.content_size.is_some() {
            info.content_size = Some(data.len() as u64);
        }
        let independent = matches!(info.block_mode, lz4_flex::frame::BlockMode::Independent);
        let mut frame = lz4_frame(&data, info);
        if let Some((at, x)) = damage {
            let i = at.index(frame.len());
            frame[i] ^= x;
        }
        let limit = data.len().saturating_sub(limit_cut);
        let streamed = lz4_decompress_streaming(&frame, limit, None);
        match lz4::decompress_sized(&frame, limit, None) {
            Some(Ok(Some(b))) => prop_assert_eq!(Some(b), streamed.ok().flatten()),
            Some(Ok(None)) => prop_assert!(damage.is_some() || matches!(streamed, Ok(None))),
            Some(Err(e)) => prop_assert!(false, "the sized path reports no errors: {}", e),
            None => prop_assert!(damage.is_some() || !independent),
        }
    }
}

/// kafkapipe writes the LZ4 frame Kafka's Java client and librdkafka write: version 01,
/// independent 64 KiB blocks, no checksums (header `04 22 4d 18 60 40 82`); a block that
/// does not shrink is stored, so incompressible data grows by a few bytes per block only.
#[test]
fn lz4_frames_are_written_as_kafka_writes_them() {
    let noise = crate::util::noise(200_000, 3);
    let mut out = BytesMut::new();
    Compression::Lz4.compress(&noise, &mut out).unwrap();
    assert_eq!(&out[..7], &[0x04, 0x22, 0x4d, 0x18, 0x60, 0x40, 0x82]);
    // four blocks (three of 64 KiB), each stored: a 4-byte header, then the bytes as they are
    let mut at = 7;
    for block in noise.chunks(64 << 10) {
        let word = u32::from_le_bytes(out[at..at + 4].try_into().unwrap());
        assert_eq!(word, block.len() as u32 | 0x8000_0000);
        assert_eq!(&out[at + 4..at + 4 + block.len()], block);
        at += 4 + block.len();
    }
    assert_eq!(
        &out[at..],
        &[0, 0, 0, 0],
        "the end mark, and no content checksum"
    );
}

proptest! {
    /// What kafkapipe writes, `lz4_flex`'s own streaming frame decoder reads back.
    #[test]
    fn lz4_frames_written_here_read_with_the_reference_decoder(
        data in proptest::collection::vec(0u8..8, 0..300_000),
    ) {
        use std::io::Read;
        let mut out = BytesMut::new();
        Compression::Lz4.compress(&data, &mut out).unwrap();
        let mut back = Vec::new();
        lz4_flex::frame::FrameDecoder::new(&out[..]).read_to_end(&mut back).unwrap();
        prop_assert_eq!(back, data);
    }
}

// ---- the LZ4 block decoder ---------------------------------------------------------------

/// `lz4::decode_block` into a buffer of `cap` bytes: the decoded bytes, or `None`.
fn lz4_block(block: &[u8], cap: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; cap];
    let n = lz4::decode_block(block, &mut out)?;
    out.truncate(n);
    Some(out)
}

/// `lz4_flex`'s block decoder, the reference: the decoded bytes, or `None` on its errors.
fn lz4_flex_block(block: &[u8], cap: usize) -> Option<Vec<u8>> {
    let mut out = vec![0u8; cap];
    let n = lz4_flex::block::decompress_into(block, &mut out).ok()?;
    out.truncate(n);
    Some(out)
}

#[test]
fn lz4_block_empty_input_is_an_error_and_a_lone_token_is_empty() {
    assert_eq!(lz4_block(&[], 100), None);
    assert_eq!(lz4_flex_block(&[], 100), None);
    // what an empty input compresses to: one token, no literals, no match
    assert_eq!(lz4_flex::block::compress(&[]), [0]);
    assert_eq!(lz4_block(&[0], 0), Some(vec![]));
    assert_eq!(lz4_block(&[0], 100), Some(vec![]));
}

#[test]
fn lz4_block_match_offsets_must_be_inside_the_block() {
    // one literal 'a', then a 4-byte match at offset 1, then an empty last sequence
    assert_eq!(
        lz4_block(&[0x10, b'a', 1, 0, 0], 5),
        Some(b"aaaaa".to_vec())
    );
    // offset 0 is forbidden
    assert_eq!(lz4_block(&[0x10, b'a', 0, 0, 0], 100), None);
    // offset 2 reaches before the block's first byte
    assert_eq!(lz4_block(&[0x10, b'a', 2, 0, 0], 100), None);
    // a match with no literal before it at all
    assert_eq!(lz4_block(&[0x00, 1, 0, 0], 100), None);
    // the same, with the sequence in the fast path (more than 32 bytes of input left)
    let mut long = vec![0x10, b'a', 2, 0];
    long.extend_from_slice(&[0xF0, 40]);
    long.extend_from_slice(&[b'z'; 55]);
    assert_eq!(lz4_block(&long, 1000), None);
    assert_eq!(lz4_flex_block(&long, 1000), None);
    long[2] = 1;
    let want: Vec<u8> = [&b"aaaaa"[..], &[b'z'; 55]].concat();
    assert_eq!(lz4_block(&long, 1000), Some(want));
}

#[test]
fn lz4_block_lengths_must_fit_input_and_output() {
    // the match runs past the output
    assert_eq!(lz4_block(&[0x10, b'a', 1, 0, 0], 4), None);
    // the literals run past the output
    assert_eq!(lz4_block(&[0x30, b'a', b'b', b'c'], 2), None);
    assert_eq!(
        lz4_block(&[0x30, b'a', b'b', b'c'], 3),
        Some(b"abc".to_vec())
    );
    // the literals run past the input
    assert_eq!(lz4_block(&[0x50, b'a', b'b'], 100), None);
    // truncated: in the offset, after the match (the last sequence must be literals only)
    assert_eq!(lz4_block(&[0x10, b'a', 1], 100), None);
    assert_eq!(lz4_block(&[0x10, b'a', 1, 0], 100), None);
    // truncated in a length's continuation bytes
    assert_eq!(lz4_block(&[0xF0, 255], 1000), None);
    assert_eq!(lz4_block(&[0x1F, b'a', 1, 0, 255], 1000), None);
}

#[test]
fn lz4_block_lengths_continue_in_255_bytes() {
    // literals: 15 + 255 + 10 = 280
    let lits: Vec<u8> = (0..280u32).map(|i| (i * 7) as u8).collect();
    let mut block = vec![0xF0, 255, 10];
    block.extend_from_slice(&lits);
    assert_eq!(lz4_block(&block, 280), Some(lits.clone()));
    assert_eq!(lz4_block(&block, 279), None);
    // a 255 ends nothing: 15 + 255 + 0 = 270 literals
    let mut block = vec![0xF0, 255, 0];
    block.extend_from_slice(&lits[..270]);
    assert_eq!(lz4_block(&block, 300), Some(lits[..270].to_vec()));
    // match: 4 + 15 + 255 + 3 = 277 bytes at offset 1, after one literal
    let block = [0x1F, b'a', 1, 0, 255, 3, 0x00];
    assert_eq!(lz4_block(&block, 278), Some(vec![b'a'; 278]));
    assert_eq!(lz4_block(&block, 277), None);
}

#[test]
fn lz4_block_overlapping_matches_repeat_their_period() {
    // every period 1..=40 with every match length 4..=80 (nibble-only and continued),
    // with room to spare (the fast path) and without (exact end)
    for period in 1..=40usize {
        let pattern: Vec<u8> = (0..period).map(|i| b'A' + (i % 26) as u8).collect();
        for ml in 4..=80usize {
            let mut block = Vec::new();
            let lit_nib = period.min(15) as u8;
            let ml_nib = (ml - 4).min(15) as u8;
            block.push(lit_nib << 4 | ml_nib);
            if period >= 15 {
                block.push((period - 15) as u8);
            }
            block.extend_from_slice(&pattern);
            block.extend_from_slice(&(period as u16).to_le_bytes());
            if ml - 4 >= 15 {
                block.push((ml - 4 - 15) as u8);
            }
            block.push(0x00);
            let want: Vec<u8> = pattern.iter().copied().cycle().take(period + ml).collect();
            for cap in [want.len(), want.len() + 100] {
                assert_eq!(
                    lz4_block(&block, cap).as_deref(),
                    Some(&want[..]),
                    "period {period} match {ml} cap {cap}"
                );
            }
        }
    }
}

/// Data LZ4 compresses with every kind of match: runs of one byte (offset 1), short
/// periodic patterns (small overlapping offsets), repeated text and stretches of noise.
fn lz4_block_test_data() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        (any::<u8>(), 1usize..3000).prop_map(|(b, n)| vec![b; n]),
        (proptest::collection::vec(any::<u8>(), 2..8), 1usize..500).prop_map(|(p, n)| p
            .iter()
            .copied()
            .cycle()
            .take(p.len() * n)
            .collect()),
        proptest::collection::vec(0u8..4, 0..300),
        proptest::collection::vec(any::<u8>(), 0..300),
        (0usize..5, 0u32..1000).prop_map(|(k, i)| {
            ["{\"id\":", "\"name\":\"user", "\",\"ts\":", "},", "xyz"][k]
                .repeat(1 + i as usize % 5)
                .into_bytes()
        }),
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

proptest! {
    /// Blocks `lz4_flex` compresses decode to the data, into an exact buffer or a larger one,
    /// as `lz4_flex` decodes them; a buffer one byte short is an error.
    #[test]
    fn lz4_block_decoder_reads_compressed_blocks_as_lz4_flex(
        data in lz4_block_test_data(),
        slack in 0usize..100,
    ) {
        let block = lz4_flex::block::compress(&data);
        let got = lz4_block(&block, data.len() + slack);
        prop_assert_eq!(got.as_deref(), Some(&data[..]));
        prop_assert_eq!(got, lz4_flex_block(&block, data.len() + slack));
        if !data.is_empty() {
            prop_assert_eq!(lz4_block(&block, data.len() - 1), None);
        }
    }

    /// On arbitrary and damaged blocks the decoder never panics, and agrees with `lz4_flex`:
    /// the same bytes when `lz4_flex` decodes the block, an error when it does not.
    #[test]
    fn lz4_block_decoder_agrees_with_lz4_flex_on_damaged_blocks(
        data in lz4_block_test_data(),
        raw in proptest::collection::vec(any::<u8>(), 0..200),
        use_raw in any::<bool>(),
        damage in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<proptest::sample::Index>()),
        cap_pick in any::<proptest::sample::Index>(),
    ) {
        let mut block = if use_raw { raw } else { lz4_flex::block::compress(&data) };
        if !block.is_empty() {
            for (at, x) in &damage {
                let i = at.index(block.len());
                block[i] = *x;
            }
        }
        if let Some(cut) = cut {
            let keep = cut.index(block.len() + 1);
            block.truncate(keep);
        }
        let cap = cap_pick.index(2 * data.len().max(block.len() * 4) + 64);
        prop_assert_eq!(lz4_block(&block, cap), lz4_flex_block(&block, cap));
    }
}

/// A frame whose compressed block decodes to more than the frame's block size is corrupt
/// (lz4_flex and Java's reader refuse it), even when the output buffer has room for it.
#[test]
fn an_lz4_block_larger_than_the_frame_block_size_is_an_error() {
    use crate::bufpool::BufPool;
    // BD 64 KiB, no checksums; block 1 decodes to 100 000 bytes, block 2 to 5
    let (flg, bd) = (0x60u8, 0x40u8);
    let mut frame = vec![0x04, 0x22, 0x4d, 0x18, flg, bd];
    frame.push((twox_hash::XxHash32::oneshot(0, &[flg, bd]) >> 8) as u8);
    for data in [&[0u8; 100_000][..], b"hello"] {
        let block = lz4_flex::block::compress(data);
        frame.extend_from_slice(&(block.len() as u32).to_le_bytes());
        frame.extend_from_slice(&block);
    }
    frame.extend_from_slice(&[0, 0, 0, 0]);
    let pool = BufPool::new(4, 8 << 20, 16 << 20);
    for p in [None, Some(&pool)] {
        let got = Compression::Lz4.decompress_pooled(&frame, 1 << 20, p);
        assert!(got.is_err(), "{got:?}");
    }
}

/// A frame of 4 MiB blocks (pierrec/lz4's default) holding far less than a block does not
/// pin a 4 MiB buffer for as long as its records live: the content moves to a buffer of
/// its size, and the large one goes back to the pool at once.
#[test]
fn lz4_output_of_a_frame_of_large_blocks_is_held_in_a_buffer_of_its_size() {
    use lz4_flex::frame::{BlockSize, FrameInfo};
    let data = mixed_payload(120_000);
    let frame = lz4_frame(&data, FrameInfo::new().block_size(BlockSize::Max4MB));
    let (pool, out) = lz4_decoded_with_its_buffer_back(&frame, &data, 4 << 20);
    let (kept, capacity) = pool.kept();
    drop(out);
    assert_eq!(
        pool.kept(),
        (kept, capacity),
        "the output was a copy of its own size"
    );
}

/// A small batch in a frame of 64 KiB blocks (every Kafka client's default) must not pin
/// a 64 KiB buffer while its records live: many such batches held by a consumer would
/// take a hundred times their size.
#[test]
fn lz4_output_much_smaller_than_its_block_is_held_in_a_buffer_of_its_size() {
    let data = mixed_payload(600);
    let mut frame = bytes::BytesMut::new();
    Compression::Lz4.compress(&data, &mut frame).unwrap();
    lz4_decoded_with_its_buffer_back(&frame, &data, 64 << 10);
}

/// Decode the LZ4 `frame` of `data` with a pool: its decode buffer (of at least
/// `buffer` bytes) must be back in the pool while the output lives.
fn lz4_decoded_with_its_buffer_back(
    frame: &[u8],
    data: &[u8],
    buffer: usize,
) -> (std::sync::Arc<crate::bufpool::BufPool>, Bytes) {
    let pool = crate::bufpool::BufPool::new(4, 8 << 20, 16 << 20);
    let out = Compression::Lz4
        .decompress_pooled(frame, 8 << 20, Some(&pool))
        .unwrap()
        .unwrap();
    assert_eq!(&out[..], data);
    let (kept, capacity) = pool.kept();
    assert_eq!(
        (kept, capacity >= buffer),
        (1, true),
        "the {buffer}-byte decode buffer is back in the pool while the output lives"
    );
    (pool, out)
}

/// Cut `data` at `at` (positions in any order, repeats allowed) into parts.
fn cut_at(data: &[u8], mut at: Vec<usize>) -> Vec<&[u8]> {
    at.push(0);
    at.push(data.len());
    at.sort_unstable();
    at.windows(2).map(|w| &data[w[0]..w[1]]).collect()
}

/// Records compressed from parts (a batch whose large values are kept by reference) are
/// byte for byte what they are compressed from one piece, with every codec; for LZ4 that
/// includes parts cut at, just before and just after its 64 KiB block boundaries.
#[test]
fn parts_compress_as_their_concatenation_at_block_edges() {
    let data = mixed_payload(300_000);
    let k = 64 << 10;
    let cuts = [
        vec![k],
        vec![k - 1, k + 1],
        vec![10, k, 2 * k, 2 * k + 5],
        vec![k + 1, 3 * k - 1],
        vec![0, 0, 1, 1, 300_000],
    ];
    for c in Compression::ALL {
        let mut whole = BytesMut::new();
        c.compress(&data, &mut whole).unwrap();
        for at in &cuts {
            let mut parted = BytesMut::new();
            c.compress_parts(&cut_at(&data, at.clone()), &mut parted)
                .unwrap();
            assert!(parted == whole, "{c} cut at {at:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// As above, cut anywhere.
    #[test]
    fn parts_compress_as_their_concatenation(
        data in proptest::collection::vec(0u8..8, 0..200_000),
        cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..12),
    ) {
        let at = cuts.iter().map(|i| i.index(data.len() + 1)).collect();
        let parts = cut_at(&data, at);
        for c in Compression::ALL {
            let (mut whole, mut parted) = (BytesMut::new(), BytesMut::new());
            c.compress(&data, &mut whole).unwrap();
            c.compress_parts(&parts, &mut parted).unwrap();
            prop_assert!(parted == whole, "{}", c);
        }
    }
}
