//! gRPC over the proxy: recognising a call, its deadline, and answering gateway errors the
//! way gRPC clients read them (a trailers-only response with `grpc-status`).

use std::time::Duration;

use crate::error::ErrorKind;

/// Longest deadline honoured; longer ones saturate here.
const MAX_DEADLINE: Duration = Duration::from_secs(24 * 3600);

/// Whether a `content-type` value is gRPC's: `application/grpc`, alone or followed by a
/// `+format` suffix (`application/grpc+proto`) or parameters. gRPC-Web
/// (`application/grpc-web...`) is not: its trailers travel in the body, and it is proxied as
/// plain HTTP.
pub fn is_grpc_content_type(value: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    value.len() >= GRPC.len()
        && value[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(
            value.get(GRPC.len()),
            None | Some(b'+' | b';' | b' ' | b'\t')
        )
}

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H` hours, `M` minutes,
/// `S` seconds, `m` milliseconds, `u` microseconds, `n` nanoseconds; case-exact). Values
/// beyond a day saturate at a day; anything else is `None` (no deadline).
pub fn parse_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    let d = match unit {
        b'H' => Duration::from_secs(n.saturating_mul(3600)),
        b'M' => Duration::from_secs(n.saturating_mul(60)),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    };
    Some(d.min(MAX_DEADLINE))
}

/// `d` as a `grpc-timeout` value: whole milliseconds (rounded down: never more time than is
/// left), microseconds below one, and seconds beyond what 8 digits of milliseconds hold.
pub fn format_timeout(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        format!("{}u", d.as_micros().max(1))
    } else if ms <= 99_999_999 {
        format!("{ms}m")
    } else {
        format!("{}S", d.as_secs().min(99_999_999))
    }
}

/// `message` as a `grpc-message` value: percent-encoded as the gRPC protocol asks (each byte
/// outside 0x20–0x7E, and `%`, as `%XX`), so a client decodes the operator's text as written
/// (a `%` or UTF-8 in a maintenance message). Borrowed when nothing needs encoding.
pub fn encode_message(message: &str) -> std::borrow::Cow<'_, [u8]> {
    let plain = |b: u8| (0x20..=0x7e).contains(&b) && b != b'%';
    let bytes = message.as_bytes();
    if bytes.iter().all(|&b| plain(b)) {
        return std::borrow::Cow::Borrowed(bytes);
    }
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = Vec::with_capacity(bytes.len() * 3);
    for &b in bytes {
        if plain(b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[usize::from(b >> 4)], HEX[usize::from(b & 15)]]);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The gRPC status code for a gateway error (the gRPC-over-HTTP mapping, with ringway's own
/// timeouts for a response as DEADLINE_EXCEEDED). A connect that timed out is UNAVAILABLE: the
/// call never reached a server, and UNAVAILABLE is the code clients may retry on.
pub fn status_for(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::UpstreamTimeout => 4, // DEADLINE_EXCEEDED
        ErrorKind::NoRoute => 12,        // UNIMPLEMENTED
        ErrorKind::BodyTooLarge | ErrorKind::HeadTooLarge | ErrorKind::UriTooLong => 8, // RESOURCE_EXHAUSTED
        ErrorKind::BadRequest
        | ErrorKind::ExpectationFailed
        | ErrorKind::NotImplemented
        | ErrorKind::VersionNotSupported
        | ErrorKind::Internal => 13, // INTERNAL
        ErrorKind::Misdirected => 7, // PERMISSION_DENIED
        ErrorKind::RequestTimeout | ErrorKind::ClientClosed => 1, // CANCELLED
        ErrorKind::UpstreamConnect
        | ErrorKind::UpstreamConnectTimeout
        | ErrorKind::UpstreamClosed
        | ErrorKind::UpstreamInvalid
        | ErrorKind::ShuttingDown
        | ErrorKind::Maintenance
        | ErrorKind::CircuitOpen
        | ErrorKind::GatewaySaturated
        | ErrorKind::UpstreamSaturated
        | ErrorKind::NoEndpoint => 14, // UNAVAILABLE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded_where_grpc_asks() {
        assert!(matches!(
            encode_message("upstream unavailable"),
            std::borrow::Cow::Borrowed(b"upstream unavailable")
        ));
        assert_eq!(&*encode_message("ü 100%"), b"%C3%BC 100%25");
        assert_eq!(&*encode_message("a\tb~"), b"a%09b~");
    }

    #[test]
    fn timeouts_are_written_as_they_are_read() {
        for d in [
            Duration::from_millis(1500),
            Duration::from_micros(250),
            Duration::from_nanos(10),
            Duration::from_secs(24 * 3600),
            Duration::from_secs(200_000),
        ] {
            let text = format_timeout(d);
            let back = parse_timeout(text.as_bytes()).expect(&text);
            assert!(back <= d.max(Duration::from_micros(1)), "{text}");
            assert!(
                d.min(MAX_DEADLINE).abs_diff(back) < Duration::from_millis(1),
                "{text}"
            );
        }
        assert_eq!(format_timeout(Duration::from_millis(1999)), "1999m");
    }

    #[test]
    fn timeouts_follow_the_grammar() {
        assert_eq!(parse_timeout(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_timeout(b"5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_timeout(b"2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_timeout(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_timeout(b"9n"), Some(Duration::from_nanos(9)));
        assert_eq!(
            parse_timeout(b"99999999H"),
            Some(MAX_DEADLINE),
            "saturates at a day"
        );
        for bad in [
            &b""[..],
            b"m",
            b"123456789m",
            b"10s",
            b"1.5S",
            b"-1S",
            b"10",
            b" 1S",
        ] {
            assert_eq!(
                parse_timeout(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn grpc_content_types() {
        for yes in [
            &b"application/grpc"[..],
            b"application/grpc+proto",
            b"Application/GRPC+json",
            b"application/grpc; charset=utf-8",
        ] {
            assert!(
                is_grpc_content_type(yes),
                "{:?}",
                String::from_utf8_lossy(yes)
            );
        }
        for no in [
            &b"application/grpc-web"[..],
            b"application/grpc-web-text+proto",
            b"application/grpcx",
            b"application/json",
            b"application/grp",
        ] {
            assert!(
                !is_grpc_content_type(no),
                "{:?}",
                String::from_utf8_lossy(no)
            );
        }
    }

    #[test]
    fn every_error_has_a_status() {
        for kind in ErrorKind::ALL {
            assert!(status_for(kind) > 0);
        }
        assert_eq!(status_for(ErrorKind::UpstreamTimeout), 4);
        assert_eq!(status_for(ErrorKind::CircuitOpen), 14);
        assert_eq!(status_for(ErrorKind::UpstreamConnectTimeout), 14);
    }
}
