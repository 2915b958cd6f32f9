//! Property tests for the HTTP/1.1 codec: generated valid messages parse to what was generated,
//! at every split; arbitrary bytes never break an invariant.

use proptest::prelude::*;
use ringway::http1::{
    filter_in_place, parse_request, BodyFraming, ChunkedDecoder, HeadLimits, Keep, Method,
    RequestHead,
};

fn token() -> impl Strategy<Value = String> {
    "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}"
}

fn value() -> impl Strategy<Value = String> {
    "[ -~]{0,40}".prop_map(|s| s.trim().to_string())
}

prop_compose! {
    fn request()(
        method in prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
        // Paths in normal form (no dot-segments, no encoded unreserved characters): others are
        // refused by design (see `paths_that_normalize_differently_are_refused`).
        path in "/([a-zA-Z0-9_~-]{0,8}(%2[0F])?(\\.[a-z]{1,3})?/?){0,5}",
        query in prop::option::of("[a-zA-Z0-9=&_%-]{0,20}"),
        host in "[a-z0-9]{1,10}(\\.[a-z]{2,5})?(:[0-9]{1,5})?",
        headers in prop::collection::vec((token(), value()), 0..12),
        length in prop::option::of(0u32..100000),
    ) -> (String, Vec<u8>, Vec<(String, String)>, Option<u32>) {
        let mut text = format!("{method} {path}");
        if let Some(q) = &query {
            text.push('?');
            text.push_str(q);
        }
        text.push_str(" HTTP/1.1\r\nHost: ");
        text.push_str(&host);
        text.push_str("\r\n");
        // Drop generated names the codec treats specially, so the expectations stay simple.
        let headers: Vec<(String, String)> = headers
            .into_iter()
            .filter(|(n, _)| {
                let l = n.to_ascii_lowercase();
                !["host", "content-length", "transfer-encoding", "connection", "expect", "te",
                  "upgrade", "keep-alive", "proxy-connection"].contains(&l.as_str())
            })
            .collect();
        for (n, v) in &headers {
            text.push_str(&format!("{n}: {v}\r\n"));
        }
        if let Some(n) = length {
            text.push_str(&format!("Content-Length: {n}\r\n"));
        }
        text.push_str("\r\n");
        (format!("{path}{}", query.map(|q| format!("?{q}")).unwrap_or_default()), text.into_bytes(), headers, length)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn generated_requests_parse_at_every_split((target, bytes, headers, length) in request()) {
        // (`%2F` is generated too: allowed here, as with `http.encoded_slashes = "keep"`.)
        let limits = HeadLimits { max_head_bytes: 64 * 1024, max_headers: 64, max_request_line_bytes: 8192, encoded_slashes: true, path_parameters: true, reject_repeated_slashes: false };
        let mut head = RequestHead::default();
        let n = parse_request(&bytes, &limits, &mut head).unwrap().unwrap();
        prop_assert_eq!(n, bytes.len());
        let path_and_query = [head.path.get(&bytes), head.query.get(&bytes)].concat();
        prop_assert_eq!(path_and_query, target.into_bytes());
        let parsed: Vec<(String, String)> = head.headers.iter()
            .filter(|h| !h.name.get(&bytes).eq_ignore_ascii_case(b"host")
                && !h.name.get(&bytes).eq_ignore_ascii_case(b"content-length"))
            .map(|h| (String::from_utf8_lossy(h.name.get(&bytes)).into_owned(),
                      String::from_utf8_lossy(h.value.get(&bytes)).into_owned()))
            .collect();
        prop_assert_eq!(parsed, headers);
        prop_assert_eq!(head.framing, length.map_or(BodyFraming::None, |n| BodyFraming::Length(u64::from(n))));
        prop_assert!(head.keep_alive);
        prop_assert!(matches!(head.method, Method::Get | Method::Head | Method::Post | Method::Put | Method::Delete | Method::Patch | Method::Options));
        for cut in 0..bytes.len() {
            let mut h = RequestHead::default();
            prop_assert_eq!(parse_request(&bytes[..cut], &limits, &mut h), Ok(None), "cut {}", cut);
        }
    }

    #[test]
    fn arbitrary_bytes_keep_head_invariants(data in prop::collection::vec(any::<u8>(), 0..512)) {
        ringway::fuzzing::request_head(&data);
        ringway::fuzzing::response_head(&data);
    }

    #[test]
    fn request_like_bytes_keep_head_invariants(
        prefix in prop::sample::select(vec!["GET / HTTP/1.1\r\n", "POST /x HTTP/1.0\r\n", "HTTP/1.1 200 OK\r\n"]),
        rest in "[ -~\r\n\t]{0,200}",
    ) {
        let data = [prefix.as_bytes(), rest.as_bytes()].concat();
        ringway::fuzzing::request_head(&data);
        ringway::fuzzing::response_head(&data);
    }

    #[test]
    fn chunked_round_trips_at_any_split(
        body in prop::collection::vec(any::<u8>(), 0..3000),
        sizes in prop::collection::vec(1usize..700, 1..20),
        ext in prop::option::of("[a-z]{1,5}(=[a-z0-9]{1,5})?"),
        trailers in prop::collection::vec(("[A-Za-z][A-Za-z0-9-]{0,10}", "[ -~]{0,20}"), 0..3),
        cuts in prop::collection::vec(0usize..4000, 0..6),
    ) {
        // Encode.
        let mut encoded = Vec::new();
        // What is relayed: no chunk extensions; with and without the trailer fields.
        let mut framed = Vec::new();
        let mut without_trailers = Vec::new();
        let mut rest = &body[..];
        let mut i = 0;
        while !rest.is_empty() {
            let n = sizes[i % sizes.len()].min(rest.len());
            let line = match &ext {
                Some(e) => format!("{n:x};{e}\r\n"),
                None => format!("{n:x}\r\n"),
            };
            let bare = format!("{n:x}\r\n");
            for (out, line) in [(&mut encoded, &line), (&mut framed, &bare), (&mut without_trailers, &bare)] {
                out.extend_from_slice(line.as_bytes());
                out.extend_from_slice(&rest[..n]);
                out.extend_from_slice(b"\r\n");
            }
            rest = &rest[n..];
            i += 1;
        }
        encoded.extend_from_slice(b"0\r\n");
        framed.extend_from_slice(b"0\r\n");
        without_trailers.extend_from_slice(b"0\r\n\r\n");
        for (n, v) in &trailers {
            let line = format!("{n}: {}\r\n", v.trim());
            encoded.extend_from_slice(line.as_bytes());
            // A relay keeps the fields a trailer may carry.
            if ringway::http1::HeaderKind::classify(n.as_bytes()).fits_a_trailer() {
                framed.extend_from_slice(line.as_bytes());
            }
        }
        encoded.extend_from_slice(b"\r\n");
        framed.extend_from_slice(b"\r\n");

        // Decode in pieces, both ways.
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (encoded.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        for (keep, want) in [(Keep::DataOnly, &body), (Keep::NoTrailers, &without_trailers), (Keep::Framed, &framed)] {
            let mut dec = ChunkedDecoder::new();
            let mut out = Vec::new();
            let mut start = 0;
            let mut left = Vec::new();
            for end in cuts.iter().copied().chain([encoded.len()]) {
                // What a call left unconsumed (the start of a trailer field line, `Framed`
                // only) comes again before the next piece.
                let mut piece = std::mem::take(&mut left);
                piece.extend_from_slice(&encoded[start..end]);
                let (kept, consumed) = filter_in_place(&mut dec, &mut piece, keep).unwrap();
                if keep != Keep::Framed || dec.is_done() {
                    prop_assert_eq!(consumed, piece.len());
                }
                out.extend_from_slice(&piece[..kept]);
                left = piece[consumed..].to_vec();
                start = end;
            }
            prop_assert!(dec.is_done());
            prop_assert_eq!(&out, want, "{:?}", keep);
            prop_assert_eq!(dec.data_total() as usize, body.len());
        }
    }

    #[test]
    fn arbitrary_bytes_keep_chunked_invariants(data in prop::collection::vec(any::<u8>(), 0..512)) {
        ringway::fuzzing::chunked(&data);
    }

    #[test]
    fn arbitrary_config_text_never_panics(text in "[ -~\n\\[\\]=\"]{0,300}") {
        ringway::fuzzing::config(text.as_bytes());
    }
}
