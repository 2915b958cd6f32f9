//! Entry points for fuzz targets (`fuzz/`) and their stable corpus replay
//! (`tests/fuzz_corpus.rs`). Each takes arbitrary bytes and asserts the parser's invariants;
//! a panic is a finding.

use crate::http1::{
    check_partial, filter_in_place, may_complete_head, parse_request, parse_response,
    ChunkedDecoder, HeadLimits, Keep, Method, RequestHead, ResponseHead,
};

/// Request head parser: never panics; a complete head lies within the input, its spans too;
/// every strict prefix of a complete head is incomplete or the same error class; the head-end
/// pre-check never hides a complete head.
pub fn request_head(data: &[u8]) {
    let limits = HeadLimits {
        max_head_bytes: 4096,
        max_headers: 32,
        max_request_line_bytes: 1024,
        ..HeadLimits::default()
    };
    let mut head = RequestHead::default();
    let result = parse_request(data, &limits, &mut head);
    if let Ok(Some(len)) = result {
        assert!(len <= data.len());
        assert!(
            may_complete_head(&data[..len], 0),
            "complete head not detected"
        );
        for span in [
            head.method_span,
            head.target,
            head.path,
            head.query,
            head.host,
        ] {
            assert!(span.end() <= len, "span outside the head");
        }
        for h in &head.headers {
            assert!(h.name.end() <= len && h.value.end() <= len);
        }
        // Prefixes: a shorter input is never complete.
        for cut in [len / 2, len.saturating_sub(1)] {
            let mut h2 = RequestHead::default();
            if let Ok(Some(n)) = parse_request(&data[..cut], &limits, &mut h2) {
                panic!("prefix of {cut} bytes complete at {n}, whole at {len}");
            }
        }
    } else if let Ok(None) = result {
        assert!(check_partial(data, &limits).is_ok());
    }
}

/// Response head parser: never panics; a complete head lies within the input.
pub fn response_head(data: &[u8]) {
    let mut head = ResponseHead::default();
    for method in [Method::Get, Method::Head] {
        if let Ok(Some(len)) = parse_response(data, 64, method, &mut head) {
            assert!(len <= data.len());
            assert!(head.reason.end() <= len);
            for h in &head.headers {
                assert!(h.name.end() <= len && h.value.end() <= len);
            }
        }
    }
}

/// Chunked decoder: never panics, always makes progress, consumes no more than given, and gives
/// the same result however the input is split; so does a relay's filter ([`Keep::Framed`],
/// which holds back a trailer field line until its end has come).
pub fn chunked(data: &[u8]) {
    let whole = run_chunked(data, &[]);
    let split = data.first().map_or(1, |b| (*b as usize % 7) + 1);
    let cuts: Vec<usize> = (split..data.len()).step_by(split).collect();
    assert_eq!(run_chunked(data, &cuts), whole, "split every {split}");
    let framed = run_framed(data, &[]);
    assert_eq!(
        run_framed(data, &cuts),
        framed,
        "framed, split every {split}"
    );
    if let (Ok((_, used, true)), Ok((_, framed_used, true))) = (&whole, &framed) {
        assert_eq!(used, framed_used, "the body ends at the same byte");
    }
}

/// A relay's pass: what a call leaves unconsumed comes again before the next piece.
fn run_framed(data: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, usize, bool), ()> {
    let mut dec = ChunkedDecoder::new();
    let (mut out, mut left, mut used, mut start) = (Vec::new(), Vec::new(), 0, 0);
    for end in cuts.iter().copied().chain([data.len()]) {
        let mut piece = std::mem::take(&mut left);
        piece.extend_from_slice(&data[start..end]);
        let (kept, consumed) =
            filter_in_place(&mut dec, &mut piece, Keep::Framed).map_err(|_| ())?;
        assert!(kept <= consumed && consumed <= piece.len(), "bounds");
        out.extend_from_slice(&piece[..kept]);
        used += consumed;
        if dec.is_done() {
            break;
        }
        left = piece[consumed..].to_vec();
        // Only the start of a trailer field line waits, and never its end.
        assert!(!left.contains(&b'\n'), "a whole line held back");
        start = end;
    }
    assert!(used <= data.len());
    Ok((out, used, dec.is_done()))
}

fn run_chunked(data: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, usize, bool), ()> {
    let mut dec = ChunkedDecoder::new();
    let mut out = Vec::new();
    let mut used = 0;
    let mut start = 0;
    for end in cuts.iter().copied().chain([data.len()]) {
        let mut piece = data[start..end].to_vec();
        let mut offset = 0;
        while offset < piece.len() && !dec.is_done() {
            let (kept, consumed) =
                filter_in_place(&mut dec, &mut piece[offset..], Keep::DataOnly).map_err(|_| ())?;
            assert!(consumed > 0 && kept <= consumed, "progress");
            out.extend_from_slice(&piece[offset..offset + kept]);
            offset += consumed;
            used += consumed;
        }
        assert!(dec.data_total() as usize == out.len());
        if dec.is_done() {
            break;
        }
        start = end;
    }
    assert!(used <= data.len());
    Ok((out, used, dec.is_done()))
}

/// Config compiler: never panics on any text.
pub fn config(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::config::compile(text, "fuzz.toml");
    }
}
