//! Body framing: Content-Length values and a strict, streaming chunked decoder
//! (RFC 9112 §6.2, §7.1).
//!
//! The decoder never buffers: it is fed whatever bytes arrived and reports, step by step, how
//! many of them are framing and how many are data, so the proxy can relay chunked bodies
//! validated, without chunk extensions (a recipient must ignore those it does not know,
//! RFC 9112 §7.1.1, and none is forwarded for a backend to parse differently), or strip the
//! framing for HTTP/1.0 clients.

use super::is_tchar;

/// Longest chunk-size line we accept, extensions included.
pub const MAX_CHUNK_LINE_BYTES: usize = 4096;
/// Most hex digits in a chunk size after its leading zeros (16 digits fill a u64).
pub const MAX_CHUNK_SIZE_DIGITS: usize = 16;
/// Most bytes of trailer section, final empty line included.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Parses a Content-Length value: `1*DIGIT`, or a list of identical such values
/// (RFC 9110 §8.6). `None` when invalid, differing or overflowing.
pub fn parse_content_length(value: &[u8]) -> Option<u64> {
    let mut result: Option<u64> = None;
    for element in value.split(|&b| b == b',') {
        let element = super::trim_ows(element);
        if element.is_empty() || !element.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Leading zeros are allowed in any number (`1*DIGIT`); what follows them is bounded.
        let zeros = element.iter().take_while(|&&d| d == b'0').count();
        let element = &element[zeros..];
        if element.len() > 19 {
            return None;
        }
        let n = element.iter().try_fold(0u64, |acc, &d| {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        if result.is_some_and(|r| r != n) {
            return None;
        }
        result = Some(n);
    }
    result
}

/// Why a chunked body is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedError {
    /// A chunk size that is not hex digits, at most 16 after leading zeros.
    InvalidSize,
    /// A chunk-size line (with extensions) longer than [`MAX_CHUNK_LINE_BYTES`].
    LineTooLong,
    /// A byte not allowed where it stands (bare CR or LF, control character, ...).
    InvalidByte,
    /// Chunk data not followed by CRLF.
    MissingDataCrlf,
    /// Trailer section longer than [`MAX_TRAILER_BYTES`] or malformed.
    InvalidTrailer,
}

/// One step of decoding: the first `n` bytes of the input given are...
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// ...framing (sizes, CRLFs, the trailer section's end), or all of the input if it ended
    /// inside framing.
    Framing(usize),
    /// ...a chunk extension: what follows the size digits on a size line (whitespace, `;`,
    /// names and values), up to its CR.
    Extension(usize),
    /// ...chunk data.
    Data(usize),
    /// ...trailer field lines (each through its CRLF), or all of the input if it ended inside
    /// one. The empty line ending the trailer section is framing.
    Trailer(usize),
    /// ...the end of the body: the last framing bytes, through the final CRLF.
    Done(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the first hex digit of a chunk size.
    SizeStart,
    /// Inside the hex digits.
    Size,
    /// After the digits, in whitespace that must lead to `;`.
    SizeWs,
    /// Inside chunk extensions.
    Ext,
    /// Seen the CR that ends the size line.
    SizeLf,
    /// Inside chunk data.
    Data,
    /// Expecting the CR after chunk data.
    DataCr,
    /// Expecting the LF after chunk data.
    DataLf,
    /// At the start of a trailer field line, or of the final CRLF.
    TrailerStart,
    /// Inside a trailer field name.
    TrailerName,
    /// Inside a trailer field value.
    TrailerValue,
    /// Seen the CR that ends a trailer field line.
    TrailerLf,
    /// Seen the CR of the final empty line.
    EndLf,
    /// The body is complete.
    Done,
}

impl Step {
    /// How many input bytes the step is about.
    pub fn bytes(self) -> usize {
        match self {
            Step::Framing(n) | Step::Extension(n) | Step::Data(n) | Step::Trailer(n) => n,
            Step::Done(n) => n,
        }
    }
}

/// What a run of input bytes is, for [`ChunkedDecoder::step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    Framing,
    Extension,
    Trailer,
}

impl Run {
    fn step(self, n: usize) -> Step {
        match self {
            Run::Framing => Step::Framing(n),
            Run::Extension => Step::Extension(n),
            Run::Trailer => Step::Trailer(n),
        }
    }
}

/// Streaming chunked decoder; see the module docs.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    digits: usize,
    line: usize,
    trailer: usize,
    data_total: u64,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::SizeStart,
            size: 0,
            digits: 0,
            line: 0,
            trailer: 0,
            data_total: 0,
        }
    }

    /// Whether the final CRLF was seen.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Data bytes decoded so far (framing excluded).
    pub fn data_total(&self) -> u64 {
        self.data_total
    }

    /// Decodes from the front of `input` (non-empty unless done) and says what the first bytes
    /// are. Call again with the rest of the input.
    pub fn step(&mut self, input: &[u8]) -> Result<Step, ChunkedError> {
        if self.state == State::Data {
            let n = (self.size.min(input.len() as u64)) as usize;
            self.size -= n as u64;
            self.data_total += n as u64;
            if self.size == 0 {
                self.state = State::DataCr;
            }
            return Ok(Step::Data(n));
        }
        let mut i = 0;
        let run = self.run_of(input[0]);
        while i < input.len() {
            let b = input[i];
            if i > 0 && self.run_of(b) != run {
                return Ok(run.step(i));
            }
            i += 1;
            match self.state {
                State::SizeStart | State::Size => {
                    self.bump_line()?;
                    if let Some(d) = hex_value(b) {
                        // Leading zeros do not count (the line's length bounds them).
                        if self.size != 0 || d != 0 {
                            self.digits += 1;
                        }
                        if self.digits > MAX_CHUNK_SIZE_DIGITS {
                            return Err(ChunkedError::InvalidSize);
                        }
                        self.size = (self.size << 4) | u64::from(d);
                        self.state = State::Size;
                        continue;
                    }
                    if self.state == State::SizeStart {
                        return Err(ChunkedError::InvalidSize);
                    }
                    self.state = match b {
                        b'\r' => State::SizeLf,
                        b';' => State::Ext,
                        b' ' | b'\t' => State::SizeWs,
                        _ => return Err(ChunkedError::InvalidSize),
                    };
                }
                State::SizeWs => {
                    self.bump_line()?;
                    self.state = match b {
                        b' ' | b'\t' => State::SizeWs,
                        b';' => State::Ext,
                        _ => return Err(ChunkedError::InvalidByte),
                    };
                }
                State::Ext => {
                    self.bump_line()?;
                    match b {
                        b'\r' => self.state = State::SizeLf,
                        b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                        _ => return Err(ChunkedError::InvalidByte),
                    }
                }
                State::SizeLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::InvalidByte);
                    }
                    self.line = 0;
                    self.digits = 0;
                    if self.size == 0 {
                        self.state = State::TrailerStart;
                    } else {
                        self.state = State::Data;
                        return Ok(Step::Framing(i));
                    }
                }
                State::DataCr => {
                    if b != b'\r' {
                        return Err(ChunkedError::MissingDataCrlf);
                    }
                    self.state = State::DataLf;
                }
                State::DataLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::MissingDataCrlf);
                    }
                    self.state = State::SizeStart;
                }
                State::TrailerStart => {
                    self.bump_trailer()?;
                    self.state = match b {
                        b'\r' => State::EndLf,
                        _ if is_tchar(b) => State::TrailerName,
                        // Leading whitespace would be obs-fold; bare LF is not a line end here.
                        _ => return Err(ChunkedError::InvalidTrailer),
                    };
                }
                State::TrailerName => {
                    self.bump_trailer()?;
                    match b {
                        b':' => self.state = State::TrailerValue,
                        _ if is_tchar(b) => {}
                        _ => return Err(ChunkedError::InvalidTrailer),
                    }
                }
                State::TrailerValue => {
                    self.bump_trailer()?;
                    match b {
                        b'\r' => self.state = State::TrailerLf,
                        b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                        _ => return Err(ChunkedError::InvalidTrailer),
                    }
                }
                State::TrailerLf => {
                    self.bump_trailer()?;
                    if b != b'\n' {
                        return Err(ChunkedError::InvalidTrailer);
                    }
                    self.state = State::TrailerStart;
                }
                State::EndLf => {
                    if b != b'\n' {
                        return Err(ChunkedError::InvalidTrailer);
                    }
                    self.state = State::Done;
                    return Ok(Step::Done(i));
                }
                State::Data | State::Done => {
                    // Data is handled above; Done consumes nothing.
                    return Ok(Step::Done(i - 1));
                }
            }
        }
        Ok(run.step(i))
    }

    /// Whether `next` starts a trailer field line.
    fn at_field_line(&self, next: u8) -> bool {
        self.state == State::TrailerStart && next != b'\r'
    }

    /// What `next`, fed in the current state, belongs to. (A byte invalid where it stands
    /// may land in any run: the step it would end fails first.)
    fn run_of(&self, next: u8) -> Run {
        match self.state {
            State::TrailerName | State::TrailerValue | State::TrailerLf => Run::Trailer,
            State::TrailerStart if next != b'\r' => Run::Trailer,
            State::Size if next != b'\r' && hex_value(next).is_none() => Run::Extension,
            State::SizeWs | State::Ext if next != b'\r' => Run::Extension,
            _ => Run::Framing,
        }
    }

    fn bump_line(&mut self) -> Result<(), ChunkedError> {
        self.line += 1;
        if self.line > MAX_CHUNK_LINE_BYTES {
            return Err(ChunkedError::LineTooLong);
        }
        Ok(())
    }

    fn bump_trailer(&mut self) -> Result<(), ChunkedError> {
        self.trailer += 1;
        if self.trailer > MAX_TRAILER_BYTES {
            return Err(ChunkedError::InvalidTrailer);
        }
        Ok(())
    }
}

/// What [`filter_in_place`] keeps of a chunked stream. Chunk extensions are never kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Data, framing, and the trailer fields a trailer section may carry on: none that is
    /// connection-specific, frames or routes a message
    /// ([`super::HeaderKind::fits_a_trailer`]). A trailer field line is kept or dropped by
    /// its name, so it is taken only whole: [`filter_in_place`] stops before a line whose
    /// end is not in its input yet.
    Framed,
    /// Data and framing, no trailer fields (the final empty line stays).
    NoTrailers,
    /// Chunk data only: the body without its framing.
    DataOnly,
}

impl Keep {
    fn keeps(self, step: Step) -> bool {
        match (self, step) {
            (_, Step::Extension(_)) => false,
            (Keep::Framed, _) => true,
            (Keep::NoTrailers, Step::Trailer(_)) => false,
            (Keep::NoTrailers, _) => true,
            (Keep::DataOnly, Step::Data(_)) => true,
            (Keep::DataOnly, _) => false,
        }
    }
}

/// Decodes the front of `data` (up to the end of the body), moving the bytes `keep` keeps down
/// over the others, in place. Returns (kept bytes, now at the front; input bytes consumed).
/// Nothing moves while everything so far was kept. With [`Keep::Framed`], bytes can be left
/// unconsumed before the body's end: the start of a trailer field line, to be given again
/// with what follows it.
pub fn filter_in_place(
    decoder: &mut ChunkedDecoder,
    data: &mut [u8],
    keep: Keep,
) -> Result<(usize, usize), ChunkedError> {
    let (mut read, mut written) = (0, 0);
    while read < data.len() && !decoder.is_done() {
        let (end, kept) = if keep == Keep::Framed && decoder.at_field_line(data[read]) {
            let Some(lf) = data[read..].iter().position(|&b| b == b'\n') else {
                break;
            };
            let line = &data[read..read + lf];
            let name = line
                .iter()
                .position(|&b| b == b':')
                .map_or(line, |c| &line[..c]);
            let fits = super::HeaderKind::classify(name).fits_a_trailer();
            (read + lf + 1, fits)
        } else {
            (data.len(), true)
        };
        // (A field line is stepped through to its end, however many steps that takes.)
        loop {
            let step = decoder.step(&data[read..end])?;
            let n = step.bytes();
            if kept && keep.keeps(step) {
                if written != read {
                    data.copy_within(read..read + n, written);
                }
                written += n;
            }
            read += n;
            if end == data.len() || read == end {
                break;
            }
        }
    }
    Ok((written, read))
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Runs a decoder over `input` fed in pieces of `piece` bytes. `Ok(Some((data, used)))`: the
/// decoded data and how many input bytes the body took; `Ok(None)`: the input ended first.
/// Test and fuzz helper.
#[doc(hidden)]
pub fn decode_all(input: &[u8], piece: usize) -> Result<Option<(Vec<u8>, usize)>, ChunkedError> {
    let mut dec = ChunkedDecoder::new();
    let mut data = Vec::new();
    let mut used = 0;
    for part in input.chunks(piece.max(1)) {
        let mut rest = part;
        while !rest.is_empty() && !dec.is_done() {
            match dec.step(rest)? {
                Step::Data(n) => {
                    data.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    used += n;
                }
                step => {
                    rest = &rest[step.bytes()..];
                    used += step.bytes();
                }
            }
        }
        if dec.is_done() {
            return Ok(Some((data, used)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Decoded = Result<Option<(Vec<u8>, usize)>, ChunkedError>;

    fn every_split(input: &[u8]) -> Decoded {
        let whole = decode_all(input, input.len());
        for piece in 1..input.len() {
            assert_eq!(decode_all(input, piece), whole, "piece size {piece}");
        }
        // Two-piece splits at every offset, as a read boundary would fall.
        for cut in 1..input.len() {
            let mut dec = ChunkedDecoder::new();
            let mut data = Vec::new();
            let mut used = 0;
            let mut err = None;
            'outer: for part in [&input[..cut], &input[cut..]] {
                let mut rest = part;
                while !rest.is_empty() && !dec.is_done() {
                    match dec.step(rest) {
                        Ok(Step::Data(n)) => {
                            data.extend_from_slice(&rest[..n]);
                            rest = &rest[n..];
                            used += n;
                        }
                        Ok(step) => {
                            rest = &rest[step.bytes()..];
                            used += step.bytes();
                        }
                        Err(e) => {
                            err = Some(e);
                            break 'outer;
                        }
                    }
                }
            }
            let got = match err {
                Some(e) => Err(e),
                None if dec.is_done() => Ok(Some((data, used))),
                None => Ok(None),
            };
            assert_eq!(got, whole, "cut at {cut}");
        }
        whole
    }

    #[test]
    fn content_length_values() {
        assert_eq!(parse_content_length(b"0"), Some(0));
        assert_eq!(parse_content_length(b"0012"), Some(12));
        assert_eq!(parse_content_length(b"00000000000000000000000005"), Some(5));
        assert_eq!(parse_content_length(b"0000000000000000000000"), Some(0));
        assert_eq!(parse_content_length(b"00099999999999999999999"), None);
        assert_eq!(parse_content_length(b"7, 7 ,7"), Some(7));
        assert_eq!(parse_content_length(b"7, 8"), None);
        assert_eq!(parse_content_length(b""), None);
        assert_eq!(parse_content_length(b"1e3"), None);
        assert_eq!(parse_content_length(b"18446744073709551615"), None);
        assert_eq!(
            parse_content_length(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
    }

    #[test]
    fn decodes_simple_body_at_every_split() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n";
        let (data, used) = every_split(body).unwrap().unwrap();
        assert_eq!(data, b"hello world");
        assert_eq!(used, body.len());
    }

    #[test]
    fn trailers_and_extensions() {
        let body = b"A ; name=\"v\"\r\n0123456789\r\n0\r\nX-Sum: 1\r\nY: a b\r\n\r\nNEXT";
        let (data, used) = every_split(body).unwrap().unwrap();
        assert_eq!(data, b"0123456789");
        assert_eq!(used, body.len() - 4, "stops before the next message");
    }

    #[test]
    fn rejects_malformed_bodies() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloX\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"-5\r\n",
            b"0x5\r\n",
            b"5 x\r\n",
            b"11111111111111111\r\n",
            b"1;a\x00b\r\n",
            b"1;a\nb\r\n",
            b"0\r\n bad: fold\r\n\r\n",
            b"0\r\nX: 1\n\r\n",
            b"0\r\nX\x01: 1\r\n\r\n",
            b"0\r\n\n",
        ] {
            assert!(
                every_split(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for incomplete in [&b"5\r\nhel"[..], b"0\r\n", b"0\r\nX: 1\r\n"] {
            assert_eq!(every_split(incomplete), Ok(None));
        }
    }

    #[test]
    fn trailer_lines_are_reported_apart_from_framing() {
        let body = b"2\r\nab\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n";
        for piece in 1..=body.len() {
            let mut dec = ChunkedDecoder::new();
            let mut kept = Vec::new();
            let mut trailers = Vec::new();
            for part in body.chunks(piece) {
                let mut rest = part;
                while !rest.is_empty() {
                    let (n, to_trailers) = match dec.step(rest).unwrap() {
                        Step::Trailer(n) => (n, true),
                        step => (step.bytes(), false),
                    };
                    assert!(n > 0, "progress");
                    if to_trailers {
                        trailers.extend_from_slice(&rest[..n]);
                    } else {
                        kept.extend_from_slice(&rest[..n]);
                    }
                    rest = &rest[n..];
                }
            }
            assert!(dec.is_done());
            assert_eq!(trailers, b"X-A: 1\r\nX-B: 2\r\n", "piece {piece}");
            assert_eq!(kept, b"2\r\nab\r\n0\r\n\r\n", "piece {piece}");
        }
    }

    #[test]
    fn filtering_in_place_at_every_split() {
        let body = b"3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\nNEXT";
        for (keep, want) in [
            (
                Keep::Framed,
                &b"3\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"[..],
            ),
            (Keep::NoTrailers, b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
            (Keep::DataOnly, b"abcde"),
        ] {
            for cut in 0..body.len() {
                let (out, consumed) = filter_in_two(body, cut, keep);
                assert_eq!(out, want, "{keep:?} cut {cut}");
                assert_eq!(consumed, body.len() - 4, "{keep:?} cut {cut}");
            }
        }
    }

    /// Filters `body` given in two reads split at `cut`, as a relay does: what a call leaves
    /// unconsumed comes again before the next read's bytes. (kept bytes, bytes consumed)
    fn filter_in_two(body: &[u8], cut: usize, keep: Keep) -> (Vec<u8>, usize) {
        let mut dec = ChunkedDecoder::new();
        let (mut out, mut left, mut consumed_total) = (Vec::new(), Vec::new(), 0);
        for part in [&body[..cut], &body[cut..]] {
            let mut buf = std::mem::take(&mut left);
            buf.extend_from_slice(part);
            let (kept, consumed) = filter_in_place(&mut dec, &mut buf, keep).unwrap();
            out.extend_from_slice(&buf[..kept]);
            consumed_total += consumed;
            if dec.is_done() {
                break;
            }
            left = buf[consumed..].to_vec();
        }
        assert!(dec.is_done(), "cut {cut}");
        (out, consumed_total)
    }

    #[test]
    fn relayed_trailers_keep_only_fields_a_trailer_may_carry_at_every_split() {
        let body = b"1\r\na\r\n0\r\nContent-Length: 999\r\nX-Sum: 1\r\nTransfer-Encoding: gzip\r\n\
            Host: evil\r\nconnection: close\r\nGrpc-Status: 0\r\nkeep-alive: 1\r\n\r\n";
        for cut in 0..body.len() {
            let (out, consumed) = filter_in_two(body, cut, Keep::Framed);
            assert_eq!(
                String::from_utf8_lossy(&out),
                "1\r\na\r\n0\r\nX-Sum: 1\r\nGrpc-Status: 0\r\n\r\n",
                "cut {cut}"
            );
            assert_eq!(consumed, body.len(), "cut {cut}");
        }
        // A field line whose end has not come is left unconsumed, the decoder where it was.
        let mut dec = ChunkedDecoder::new();
        let mut buf = b"0\r\nX-Sum: 1\r\nX-Pa".to_vec();
        assert_eq!(
            filter_in_place(&mut dec, &mut buf, Keep::Framed),
            Ok((13, 13))
        );
        let mut buf = b"X-Partial: 2\r\n\r\n".to_vec();
        assert_eq!(
            filter_in_place(&mut dec, &mut buf, Keep::Framed),
            Ok((16, 16))
        );
        assert!(dec.is_done());
    }

    #[test]
    fn extensions_are_dropped_at_every_split() {
        let body = b"5 ; a=b ;c=\"x;y\"\r\nhello\r\n1;e\r\n!\r\n0;last\r\nT: 1\r\n\r\n";
        for cut in 0..body.len() {
            let mut dec = ChunkedDecoder::new();
            let mut out = Vec::new();
            for part in [&body[..cut], &body[cut..]] {
                let mut buf = part.to_vec();
                let (kept, consumed) =
                    filter_in_place(&mut dec, &mut buf, Keep::NoTrailers).unwrap();
                assert_eq!(consumed, part.len(), "cut {cut}");
                out.extend_from_slice(&buf[..kept]);
            }
            assert!(dec.is_done());
            assert_eq!(out, b"5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n", "cut {cut}");
            let (out, _) = filter_in_two(body, cut, Keep::Framed);
            assert_eq!(
                out, b"5\r\nhello\r\n1\r\n!\r\n0\r\nT: 1\r\n\r\n",
                "cut {cut}"
            );
        }
    }

    #[test]
    fn long_lines_are_bounded() {
        // Leading zeros alone (no extension after them) are bounded too.
        let mut body = vec![b'0'; MAX_CHUNK_LINE_BYTES];
        body.extend_from_slice(b"1\r\nx\r\n0\r\n\r\n");
        assert_eq!(decode_all(&body, 7), Err(ChunkedError::LineTooLong));
        let mut body = vec![b'0'; MAX_CHUNK_LINE_BYTES - 2];
        body.extend_from_slice(b"1\r\nx\r\n0\r\n\r\n");
        assert!(
            decode_all(&body, 7).is_ok(),
            "a line of 4,096 bytes with its CR fits"
        );
        let mut body = b"1;".to_vec();
        body.extend(std::iter::repeat_n(b'a', MAX_CHUNK_LINE_BYTES));
        body.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
        assert_eq!(decode_all(&body, 7), Err(ChunkedError::LineTooLong));
        let mut body = b"0\r\nX: ".to_vec();
        body.extend(std::iter::repeat_n(b'a', MAX_TRAILER_BYTES));
        body.extend_from_slice(b"\r\n\r\n");
        assert_eq!(decode_all(&body, 4096), Err(ChunkedError::InvalidTrailer));
    }

    #[test]
    fn large_sizes_and_leading_zeros() {
        let mut d = ChunkedDecoder::new();
        assert_eq!(d.step(b"000000000000000F\r\n"), Ok(Step::Framing(18)));
        assert_eq!(d.step(&[0u8; 20]), Ok(Step::Data(15)));
        let mut d = ChunkedDecoder::new();
        assert_eq!(d.step(b"FFFFFFFFFFFFFFFF\r\n"), Ok(Step::Framing(18)));
        assert_eq!(d.step(&[0u8; 100]), Ok(Step::Data(100)));
        assert_eq!(d.data_total(), 100);
        // Any number of leading zeros; at most 16 digits after them.
        assert_eq!(
            decode_all(b"00000000000000000000000001\r\nx\r\n0\r\n\r\n", 1),
            Ok(Some((b"x".to_vec(), 36)))
        );
        let mut d = ChunkedDecoder::new();
        assert_eq!(
            d.step(b"00000000000000000000000000000000000000000"),
            Ok(Step::Framing(41))
        );
        assert_eq!(d.step(b"FFFFFFFFFFFFFFFF\r\n"), Ok(Step::Framing(18)));
        let mut d = ChunkedDecoder::new();
        assert_eq!(
            d.step(b"01FFFFFFFFFFFFFFFF\r\n"),
            Err(ChunkedError::InvalidSize)
        );
    }
}
