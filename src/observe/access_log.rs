//! The access log: one JSON line per request, appended to a file.
//!
//! Ownership: each worker gathers its lines in its own [`AccessLog`] (in `Worker`, one
//! thread). A full buffer, or one holding lines older than `flush_interval`, goes over a
//! bounded queue to the server's one writer thread ([`spawn_writer`]), which appends it to
//! the file. A worker never writes to a file itself (a slow disk would stall every connection
//! on its core) and never waits for the writer: with [`QUEUE_BATCHES`] buffers already
//! queued, a buffer is dropped and its lines counted as dropped. The control thread opens the
//! file for each generation ([`open`]); a reload opens it again, so rotating the log is a
//! rename and a SIGHUP. The file is in append mode: Linux appends each `write` to a regular
//! file whole, so the workers' batches never interleave within a line.
//!
//! Not here: what a line says is gathered along the request path (`proxy`); this module
//! writes it ([`AccessLog::begin`], [`Pending::outcome`], [`AccessLog::finish`]).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::http1::encode::decimal;

/// Buffers the writer thread may have queued; beyond them, workers drop what they gathered.
pub const QUEUE_BATCHES: usize = 64;

/// Most bytes of the request target a line keeps (the rest is cut, and `...` marks it): a
/// client cannot make its line too long to keep.
pub const MAX_TARGET_BYTES: usize = 4096;

/// Most bytes of the host a line keeps (then `...`).
pub const MAX_HOST_BYTES: usize = 1024;

/// Most bytes of the method a line keeps (then `...`).
pub const MAX_METHOD_BYTES: usize = 64;

/// A line longer than this is not kept (counted as dropped). The field caps above keep every
/// line below it, escapes included (at most 6 bytes per byte of input).
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// Room kept past `buffer_bytes` in a batch buffer for the line that fills it.
const LINE_ROOM: usize = 1024;

/// How often the writer thread reports failing writes (a full disk fails every batch).
const WRITE_ERROR_REPORT: Duration = Duration::from_secs(10);

/// Longest a stopping worker waits to queue its last lines, and the server for its writer to
/// write what is queued (a log on a pipe nobody reads never would).
pub const STOP_WAIT: Duration = Duration::from_secs(5);

/// A log file, shared by the workers of one generation.
#[derive(Debug)]
pub struct LogFile {
    file: File,
    path: String,
}

/// Opens `path` for appending, creating it when missing. `/dev/stdout` and `/dev/stderr`
/// are the process's own descriptors, duplicated: opening them by name fails when they are
/// sockets (a systemd service's journal).
pub fn open(path: &Path) -> Result<Arc<LogFile>, String> {
    use std::os::fd::AsFd;
    let why = |e: std::io::Error| format!("{}: cannot open the access log: {e}", path.display());
    let file = if path == Path::new("/dev/stdout") {
        File::from(
            std::io::stdout()
                .as_fd()
                .try_clone_to_owned()
                .map_err(why)?,
        )
    } else if path == Path::new("/dev/stderr") {
        File::from(
            std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_err(why)?,
        )
    } else {
        OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(why)?
    };
    Ok(Arc::new(LogFile {
        file,
        path: path.display().to_string(),
    }))
}

/// Lines for one file.
#[derive(Debug)]
struct Batch {
    file: Arc<LogFile>,
    bytes: Vec<u8>,
}

#[derive(Debug)]
enum Msg {
    Write(Batch),
    Stop,
}

/// The sending side of the writer thread's queue (cloned into every worker), and the
/// writer's count of failed writes.
#[derive(Debug, Clone)]
pub struct Queue {
    tx: SyncSender<Msg>,
    write_errors: Arc<AtomicU64>,
}

impl Queue {
    /// Asks the writer to stop once it has written what is queued before this call; false
    /// when the queue stayed full for [`STOP_WAIT`].
    pub fn stop(&self) -> bool {
        let mut msg = Msg::Stop;
        let end = Instant::now() + STOP_WAIT;
        loop {
            match self.tx.try_send(msg) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => return true,
                Err(TrySendError::Full(m)) if Instant::now() < end => {
                    msg = m;
                    // The server's own thread, stopping; never a worker's event loop.
                    #[allow(clippy::disallowed_methods)]
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TrySendError::Full(_)) => return false,
            }
        }
    }

    /// Writes that failed (a full disk, a closed pipe), since the start.
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    fn offer(&self, batch: Batch) -> Result<(), Batch> {
        match self.tx.try_send(Msg::Write(batch)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(Msg::Write(b)) | TrySendError::Disconnected(Msg::Write(b))) => {
                Err(b)
            }
            Err(_) => Ok(()),
        }
    }

    /// As `offer`, waiting up to [`STOP_WAIT`] for room: for a worker that has stopped
    /// serving and hands over its last lines.
    fn offer_waiting(&self, mut batch: Batch) -> Result<(), Batch> {
        let end = Instant::now() + STOP_WAIT;
        loop {
            match self.offer(batch) {
                Err(b) if Instant::now() < end => {
                    batch = b;
                    // A stopping worker: its event loop has nothing left to serve.
                    #[allow(clippy::disallowed_methods)]
                    std::thread::sleep(Duration::from_millis(1));
                }
                done => return done,
            }
        }
    }
}

/// Starts the writer thread.
pub fn spawn_writer() -> std::io::Result<(Queue, JoinHandle<()>)> {
    let (tx, rx) = mpsc::sync_channel(QUEUE_BATCHES);
    let write_errors = Arc::new(AtomicU64::new(0));
    let errors = write_errors.clone();
    let handle = std::thread::Builder::new()
        .name("ringway-log".into())
        .spawn(move || write_loop(rx, &errors))?;
    Ok((Queue { tx, write_errors }, handle))
}

fn write_loop(rx: Receiver<Msg>, errors: &AtomicU64) {
    let mut writer = Writer::default();
    while let Ok(Msg::Write(batch)) = rx.recv() {
        writer.write(&batch, errors);
    }
}

/// The writer thread's state between batches.
#[derive(Debug, Default)]
struct Writer {
    /// When a write error was last logged.
    reported: Option<Instant>,
    /// A file whose last write stopped part-way through a line (a full disk): the next write
    /// to it ends that line first, so that its first line starts on a line of its own.
    /// (Ended at once, the newline would fail as the write did, or leave a blank line when
    /// no byte of the batch had gone out.) Weak: a file rotated away closes when its last
    /// batch is written, torn or not (deleted, its space is given back).
    torn: Option<std::sync::Weak<LogFile>>,
}

impl Writer {
    fn write(&mut self, batch: &Batch, errors: &AtomicU64) {
        let end_torn = self
            .torn
            .as_ref()
            .is_some_and(|t| std::ptr::eq(t.as_ptr(), Arc::as_ptr(&batch.file)));
        let (ended, written, result) = write_batch(&batch.file.file, end_torn, &batch.bytes);
        if ended {
            self.torn = None;
        }
        if let Err(e) = result {
            errors.fetch_add(1, Ordering::Relaxed);
            if written > 0 && !batch.bytes[..written].ends_with(b"\n") {
                self.torn = Some(Arc::downgrade(&batch.file));
            }
            let now = Instant::now();
            if self
                .reported
                .is_none_or(|at| now.duration_since(at) >= WRITE_ERROR_REPORT)
            {
                self.reported = Some(now);
                tracing::error!(path = %batch.file.path, error = %e, "cannot write the access log");
            }
        }
    }
}

/// Writes `bytes` to `f`, after a newline when `newline_first`: whether that newline went out,
/// how many bytes of `bytes` did, and how it ended.
fn write_batch(
    mut f: &File,
    newline_first: bool,
    bytes: &[u8],
) -> (bool, usize, std::io::Result<()>) {
    if newline_first {
        if let Err(e) = f.write_all(b"\n") {
            return (false, 0, Err(e));
        }
    }
    let mut done = 0;
    while done < bytes.len() {
        match f.write(&bytes[done..]) {
            Ok(0) => {
                return (
                    newline_first,
                    done,
                    Err(std::io::ErrorKind::WriteZero.into()),
                )
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (newline_first, done, Err(e)),
        }
    }
    (newline_first, done, Ok(()))
}

/// Most spare line buffers a worker keeps for requests in progress.
const SPARE_LINES: usize = 256;

/// A worker's gatherer. Off until a generation with an access log is installed.
#[derive(Debug)]
pub struct AccessLog {
    queue: Option<Queue>,
    file: Option<Arc<LogFile>>,
    buf: Vec<u8>,
    lines: u64,
    buffer_bytes: usize,
    flush_interval: Duration,
    /// When the oldest line in `buf` was added.
    oldest: Option<Instant>,
    /// Buffers of finished lines, for the next requests' (no allocation per request).
    spare: Vec<Vec<u8>>,
}

/// What [`AccessLog`] did with lines, for the worker's counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Lines handed to the writer.
    pub written: u64,
    /// Lines dropped: the writer's queue was full.
    pub dropped: u64,
}

impl AccessLog {
    /// A gatherer that sends to `queue` (none: never on).
    pub fn new(queue: Option<Queue>) -> Self {
        AccessLog {
            queue,
            file: None,
            buf: Vec::new(),
            lines: 0,
            buffer_bytes: 0,
            flush_interval: Duration::from_secs(1),
            oldest: None,
            spare: Vec::new(),
        }
    }

    /// Whether lines are wanted.
    pub fn is_on(&self) -> bool {
        self.file.is_some()
    }

    /// Whether lines go to `file` (the same open file, not only the same path), or nowhere
    /// when the log is off.
    pub fn writes_to(&self, file: Option<&Arc<LogFile>>) -> bool {
        match (&self.file, file) {
            (Some(mine), Some(f)) => Arc::ptr_eq(mine, f),
            (None, _) => true,
            (Some(_), None) => false,
        }
    }

    /// Logs to `file` from now on (`None`: off), in batches of about `buffer_bytes`, each line
    /// written within `flush_interval`. What was gathered for the previous file goes to it
    /// first.
    pub fn install(
        &mut self,
        file: Option<Arc<LogFile>>,
        buffer_bytes: usize,
        flush_interval: Duration,
    ) -> Tally {
        let tally = self.flush();
        self.file = file.filter(|_| self.queue.is_some());
        self.buffer_bytes = buffer_bytes;
        self.flush_interval = flush_interval;
        if self.buf.capacity() > buffer_bytes + LINE_ROOM {
            self.buf = Vec::new();
        }
        if self.file.is_none() {
            self.spare = Vec::new();
        }
        tally
    }

    /// Starts the line of a request whose head was parsed at `started`.
    pub fn begin(&mut self, req: &Request<'_>, started: Instant) -> Pending {
        let mut buf = self.spare.pop().unwrap_or_default();
        req.write(&mut buf);
        Pending {
            request_end: buf.len(),
            buf,
            started,
        }
    }

    /// Adds the finished line of `p` at `now`: its response went out with `status` (0: none)
    /// and `bytes_sent` bytes. [`Pending::outcome`] was called, or is called here with no
    /// upstream and no error.
    pub fn finish(&mut self, mut p: Pending, status: u16, bytes_sent: u64, now: Instant) -> Tally {
        if p.buf.len() == p.request_end {
            p.outcome(&Outcome::default());
        }
        let tally = self.push(&p, status, bytes_sent, now);
        p.buf.clear();
        if self.file.is_some() && self.spare.len() < SPARE_LINES && p.buf.capacity() <= 4096 {
            self.spare.push(p.buf);
        }
        tally
    }

    fn push(&mut self, p: &Pending, status: u16, bytes_sent: u64, now: Instant) -> Tally {
        if self.file.is_none() {
            return Tally::default();
        }
        if self.buf.capacity() == 0 {
            // Room for the batch and its last line (one that long grows the buffer).
            self.buf.reserve_exact(self.buffer_bytes + LINE_ROOM);
        }
        let start = self.buf.len();
        p.write(&mut self.buf, SystemTime::now(), status, bytes_sent, now);
        if self.buf.len() - start > MAX_LINE_BYTES {
            // Not with the head limits in force; a line that long is not kept.
            self.buf.truncate(start);
            return Tally {
                written: 0,
                dropped: 1,
            };
        }
        self.buf.push(b'\n');
        self.lines += 1;
        self.oldest.get_or_insert(now);
        if self.buf.len() >= self.buffer_bytes {
            self.flush()
        } else {
            Tally::default()
        }
    }

    /// Hands lines older than the flush interval to the writer (the worker's tick).
    pub fn tick(&mut self, now: Instant) -> Tally {
        match self.oldest {
            Some(at) if now.saturating_duration_since(at) >= self.flush_interval => self.flush(),
            _ => Tally::default(),
        }
    }

    /// Hands every gathered line to the writer.
    pub fn flush(&mut self) -> Tally {
        self.flush_with(false)
    }

    /// Hands every gathered line to the writer, waiting up to [`STOP_WAIT`] for room in its
    /// queue: for a worker that has stopped serving.
    pub fn flush_last(&mut self) -> Tally {
        self.flush_with(true)
    }

    fn flush_with(&mut self, wait: bool) -> Tally {
        let lines = std::mem::take(&mut self.lines);
        self.oldest = None;
        if self.buf.is_empty() {
            return Tally::default();
        }
        let (Some(queue), Some(file)) = (&self.queue, &self.file) else {
            self.buf.clear();
            return Tally {
                written: 0,
                dropped: lines,
            };
        };
        // The next line allocates the next batch's buffer (once per batch).
        let bytes = std::mem::take(&mut self.buf);
        let batch = Batch {
            file: file.clone(),
            bytes,
        };
        let offered = if wait {
            queue.offer_waiting(batch)
        } else {
            queue.offer(batch)
        };
        match offered {
            Ok(()) => Tally {
                written: lines,
                dropped: 0,
            },
            Err(mut batch) => {
                // The writer is behind: keep the buffer for the next lines, drop these.
                batch.bytes.clear();
                self.buf = batch.bytes;
                Tally {
                    written: 0,
                    dropped: lines,
                }
            }
        }
    }
}

/// What a line says of the request, known once its head is parsed.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The request id (as sent to the upstream and the client).
    pub request_id: &'a [u8],
    /// The client's address (the socket's peer).
    pub client: SocketAddr,
    /// `HTTP/1.0`, `HTTP/1.1` or `HTTP/2`.
    pub protocol: &'a str,
    /// The method, as received (empty for a head that did not parse).
    pub method: &'a [u8],
    /// The host asked for (`Host`, `:authority` or an absolute target's).
    pub host: &'a [u8],
    /// The request target, as received.
    pub target: &'a [u8],
}

impl Request<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"\"request_id\":");
        put_str(out, self.request_id);
        out.extend_from_slice(b",\"client\":\"");
        put_addr(out, self.client);
        out.extend_from_slice(b"\",\"protocol\":");
        put_str(out, self.protocol.as_bytes());
        out.extend_from_slice(b",\"method\":");
        put_capped(out, self.method, MAX_METHOD_BYTES);
        out.extend_from_slice(b",\"host\":");
        put_capped(out, self.host, MAX_HOST_BYTES);
        out.extend_from_slice(b",\"target\":");
        put_capped(out, self.target, MAX_TARGET_BYTES);
    }
}

/// What a line says of where the request went, known once it was answered.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outcome<'a> {
    /// The upstream the route sends to.
    pub upstream: Option<&'a str>,
    /// The upstream endpoint of the last attempt.
    pub endpoint: Option<SocketAddr>,
    /// The classified failure that a gateway error answered or that cut the response short
    /// (`upstream_timeout`, ...).
    pub error: Option<&'a str>,
}

/// A line in progress: the request's fields, then the outcome's.
#[derive(Debug)]
pub struct Pending {
    buf: Vec<u8>,
    request_end: usize,
    started: Instant,
}

impl Pending {
    /// Adds where the request went (once; later calls change nothing). Called when the
    /// exchange ends, before a tunnel it opened runs: the line then needs nothing of the
    /// generation it was served on.
    pub fn outcome(&mut self, o: &Outcome<'_>) {
        if self.buf.len() != self.request_end {
            return;
        }
        let out = &mut self.buf;
        out.extend_from_slice(b",\"upstream\":");
        match o.upstream {
            Some(u) => put_str(out, u.as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"endpoint\":");
        match o.endpoint {
            Some(a) => {
                out.push(b'"');
                put_addr(out, a);
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"error\":");
        match o.error {
            Some(e) => put_str(out, e.as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
    }

    /// The whole line, without its newline, stamped `time`; the duration runs to `now`.
    fn write(&self, out: &mut Vec<u8>, time: SystemTime, status: u16, sent: u64, now: Instant) {
        let mut digits = [0u8; 20];
        out.extend_from_slice(b"{\"time\":\"");
        put_time(out, time);
        out.extend_from_slice(b"\",");
        out.extend_from_slice(&self.buf[..self.request_end]);
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(decimal(u64::from(status), &mut digits));
        out.extend_from_slice(b",\"bytes_sent\":");
        out.extend_from_slice(decimal(sent, &mut digits));
        out.extend_from_slice(b",\"duration_us\":");
        let d = now.saturating_duration_since(self.started);
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        out.extend_from_slice(decimal(us, &mut digits));
        out.extend_from_slice(&self.buf[self.request_end..]);
        out.push(b'}');
    }
}

/// `s` as a JSON string, quotes included; cut after `max` bytes, with `...` at the end.
fn put_capped(out: &mut Vec<u8>, s: &[u8], max: usize) {
    if s.len() <= max {
        return put_str(out, s);
    }
    put_str(out, &s[..max]);
    out.pop();
    out.extend_from_slice(b"...\"");
}

/// `s` as a JSON string, quotes included.
fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'"');
    let _ = json_escape::<()>(s, &mut |piece| {
        out.extend_from_slice(piece);
        Ok(())
    });
    out.push(b'"');
}

/// Writes `s` escaped for the inside of a JSON string through `put`, one piece at a time
/// (an escape is never split): `"`, `\` and control characters escaped, and bytes that are
/// not UTF-8 (`obs-text` in a header value) as U+FFFD, so that the output is valid JSON
/// whatever the input. Stops at `put`'s first error.
pub fn json_escape<E>(s: &[u8], put: &mut impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for chunk in s.utf8_chunks() {
        let valid = chunk.valid().as_bytes();
        let mut from = 0;
        for (i, &b) in valid.iter().enumerate() {
            if b == b'"' || b == b'\\' || b < 0x20 || b == 0x7f {
                put(&valid[from..i])?;
                match b {
                    b'"' => put(b"\\\"")?,
                    b'\\' => put(b"\\\\")?,
                    _ => put(&[
                        b'\\',
                        b'u',
                        b'0',
                        b'0',
                        HEX[usize::from(b >> 4)],
                        HEX[usize::from(b & 15)],
                    ])?,
                }
                from = i + 1;
            }
        }
        put(&valid[from..])?;
        if !chunk.invalid().is_empty() {
            put("\u{fffd}".as_bytes())?;
        }
    }
    Ok(())
}

fn put_addr(out: &mut Vec<u8>, addr: SocketAddr) {
    // `Display` of a socket address into the buffer; writing to a Vec cannot fail.
    let _ = write!(out, "{addr}");
}

/// `now` as RFC 3339 UTC with milliseconds: `2026-12-02T05:30:00.123Z`.
fn put_time(out: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let fields = [
        (month, 2usize),
        (day, 2),
        (rem / 3600, 2),
        (rem / 60 % 60, 2),
        (rem % 60, 2),
        (u64::from(since.subsec_millis()), 3),
    ];
    let mut digits = [0u8; 20];
    out.extend_from_slice(decimal(year, &mut digits));
    for ((value, width), sep) in fields.into_iter().zip([b'-', b'-', b'T', b':', b':', b'.']) {
        out.push(sep);
        let text = decimal(value, &mut digits);
        out.extend(std::iter::repeat_n(b'0', width.saturating_sub(text.len())));
        out.extend_from_slice(text);
    }
    out.push(b'Z');
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (H. Hinnant's `civil_from_days`),
/// for days from 1970 on.
fn civil_from_days(days: i64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year.max(0) as u64, month as u64, day as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(s: &[u8]) -> String {
        let mut out = Vec::new();
        put_str(&mut out, s);
        String::from_utf8(out).expect("valid UTF-8")
    }

    #[test]
    fn a_line_cut_by_a_failed_write_is_ended_before_the_next_batch() {
        use std::io::Read;
        use std::os::fd::FromRawFd;
        // A pipe whose write end does not block: a batch larger than the pipe holds goes out
        // in part, then fails, as a write to a full disk does.
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        let opened = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) };
        assert_eq!(opened, 0);
        // SAFETY: both descriptors were just opened and are owned by nothing else.
        let (mut reader, writer) =
            unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        let file = Arc::new(LogFile {
            file: writer,
            path: "pipe".into(),
        });
        let line = |n: usize, c: u8| {
            let mut l = vec![c; n];
            l.push(b'\n');
            l
        };
        let (mut w, errors) = (Writer::default(), AtomicU64::new(0));
        let big = Batch {
            file: file.clone(),
            bytes: line(1 << 20, b'a'),
        };
        w.write(&big, &errors);
        assert_eq!(errors.load(Ordering::Relaxed), 1);
        let mut cut = Vec::new();
        let _ = reader.read_to_end(&mut cut);
        assert!(
            !cut.is_empty() && !cut.ends_with(b"\n"),
            "{} bytes",
            cut.len()
        );
        // The next batch starts on a line of its own; one after it gets no blank line.
        for c in [b'b', b'c'] {
            let next = Batch {
                file: file.clone(),
                bytes: line(10, c),
            };
            w.write(&next, &errors);
        }
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
        assert_eq!(rest, b"\nbbbbbbbbbb\ncccccccccc\n");
        assert_eq!(errors.load(Ordering::Relaxed), 1);
        // Torn again, then rotated away (the log reopened on another file): the writer does
        // not keep it open, so its reader sees its end once the gatherers let go of it.
        w.write(&big, &errors);
        let _ = reader.read_to_end(&mut Vec::new());
        drop(big);
        drop(file);
        let other = Batch {
            file: Arc::new(LogFile {
                file: File::create(
                    std::env::temp_dir().join(format!("ringway-torn-{}.log", std::process::id())),
                )
                .unwrap(),
                path: "other".into(),
            }),
            bytes: line(10, b'd'),
        };
        w.write(&other, &errors);
        let mut tail = Vec::new();
        assert!(
            reader.read_to_end(&mut tail).is_ok(),
            "the rotated file's write end is still open"
        );
        let _ = std::fs::remove_file(
            std::env::temp_dir().join(format!("ringway-torn-{}.log", std::process::id())),
        );
    }

    #[test]
    fn strings_are_valid_json_whatever_the_bytes() {
        assert_eq!(escaped(b"plain /a?b=c"), r#""plain /a?b=c""#);
        assert_eq!(escaped(br#"q"b\s"#), r#""q\"b\\s""#);
        assert_eq!(escaped(b"\x01\x7f\t"), r#""\u0001\u007f\u0009""#);
        assert_eq!(escaped("caf\u{e9}".as_bytes()), "\"caf\u{e9}\"");
        assert_eq!(escaped(b"a\xffb\xc3"), "\"a\u{fffd}b\u{fffd}\"");
        // Every byte value, alone, gives valid JSON that parses back to a string.
        for b in 0..=255u8 {
            let text = escaped(&[b]);
            assert!(text.starts_with('"') && text.ends_with('"'), "{b}: {text}");
        }
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_789), (2026, 12, 2));
        assert_eq!(civil_from_days(20_819), (2027, 1, 1));
        let mut out = Vec::new();
        let at = UNIX_EPOCH + Duration::from_millis(1_796_189_405_007);
        put_time(&mut out, at);
        assert_eq!(out, b"2026-12-02T05:30:05.007Z");
    }

    fn request() -> Request<'static> {
        Request {
            request_id: b"abc-1",
            client: "127.0.0.1:5000".parse().expect("addr"),
            protocol: "HTTP/1.1",
            method: b"GET",
            host: b"example.com",
            target: b"/a?b=\"c\"",
        }
    }

    fn proxied() -> Outcome<'static> {
        Outcome {
            upstream: Some("api"),
            endpoint: Some("10.0.0.1:8080".parse().expect("addr")),
            error: None,
        }
    }

    fn text(p: &Pending, status: u16, time: SystemTime, now: Instant) -> String {
        let mut out = Vec::new();
        p.write(&mut out, time, status, 120, now);
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn line_fields() {
        let mut log = AccessLog::new(None);
        let t0 = Instant::now();
        let mut p = log.begin(&request(), t0);
        p.outcome(&proxied());
        // A second outcome changes nothing.
        p.outcome(&Outcome::default());
        let time = UNIX_EPOCH + Duration::from_millis(1_796_189_405_007);
        assert_eq!(
            text(&p, 200, time, t0 + Duration::from_micros(1534)),
            r#"{"time":"2026-12-02T05:30:05.007Z","request_id":"abc-1","client":"127.0.0.1:5000","protocol":"HTTP/1.1","method":"GET","host":"example.com","target":"/a?b=\"c\"","status":200,"bytes_sent":120,"duration_us":1534,"upstream":"api","endpoint":"10.0.0.1:8080","error":null}"#
        );
        let mut p = log.begin(&request(), t0);
        p.outcome(&Outcome {
            error: Some("no_route"),
            ..Outcome::default()
        });
        let line = text(&p, 404, UNIX_EPOCH, t0);
        assert!(
            line.starts_with(r#"{"time":"1970-01-01T00:00:00.000Z","#),
            "{line}"
        );
        assert!(
            line.ends_with(r#""status":404,"bytes_sent":120,"duration_us":0,"upstream":null,"endpoint":null,"error":"no_route"}"#),
            "{line}"
        );
    }

    #[test]
    fn long_fields_are_cut_not_the_line() {
        let mut log = AccessLog::new(None);
        let target = vec![b'/'; 10_000];
        let host = vec![0xffu8; 5000];
        let req = Request {
            target: &target,
            host: &host,
            method: &[b'M'; 100],
            ..request()
        };
        let p = log.begin(&req, Instant::now());
        let line = text(&p, 200, UNIX_EPOCH, Instant::now());
        let target_at = line.find("\"target\":\"").expect("target") + 10;
        let expected = format!("{}...\"", "/".repeat(4096));
        assert!(line[target_at..].starts_with(&expected), "{line}");
        assert!(line.contains(&format!("\"method\":\"{}...\"", "M".repeat(64))));
        // Bytes that are not UTF-8: a replacement character for each, then `...`.
        let host_at = line.find("\"host\":\"").expect("host") + 8;
        let replaced = "\u{fffd}".repeat(1024);
        assert!(
            line[host_at..].starts_with(&format!("{replaced}...\"")),
            "{line}"
        );
    }

    /// Adds `n` finished lines of status `status` at `now`; the tally of the last.
    fn add(log: &mut AccessLog, n: usize, status: u16, now: Instant) -> Tally {
        let mut tally = Tally::default();
        for _ in 0..n {
            let mut p = log.begin(&request(), now);
            p.outcome(&proxied());
            tally = log.finish(p, status, 100, now);
        }
        tally
    }

    /// A fresh directory for test `name`, and a log path in it.
    fn scratch(name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("ringway-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("access.log");
        (dir, path)
    }

    /// 1. Lines gather until the buffer holds `buffer_bytes`, then go to the writer whole.
    /// 2. A line older than the flush interval goes at the next tick.
    /// 3. With the writer's queue full, lines are dropped and counted, never waited for.
    #[test]
    fn batches_flushes_and_drops() {
        let (dir, path) = scratch("batches");
        let file = open(&path).expect("open");
        let (tx, rx) = mpsc::sync_channel(1);
        let mut log = AccessLog::new(Some(Queue {
            tx,
            write_errors: Arc::default(),
        }));
        assert!(!log.is_on());
        assert_eq!(add(&mut log, 1, 200, Instant::now()), Tally::default());
        log.install(Some(file), 1000, Duration::from_millis(100));
        assert!(log.is_on());
        let t0 = Instant::now();
        // 1. About 300 bytes a line: the fourth fills the buffer.
        assert_eq!(add(&mut log, 3, 200, t0), Tally::default());
        let full = add(&mut log, 1, 200, t0);
        assert_eq!(
            full,
            Tally {
                written: 4,
                dropped: 0
            }
        );
        // 2. One more line; the tick before the interval keeps it, the one after sends it,
        //    but the queue (capacity 1) still holds the first batch: dropped.
        add(&mut log, 1, 201, t0);
        assert_eq!(log.tick(t0 + Duration::from_millis(50)), Tally::default());
        let late = log.tick(t0 + Duration::from_millis(100));
        assert_eq!(
            late,
            Tally {
                written: 0,
                dropped: 1
            }
        );
        // 3. The writer takes the first batch: four whole lines.
        let Ok(Msg::Write(batch)) = rx.try_recv() else {
            panic!("a batch was queued");
        };
        let text = String::from_utf8(batch.bytes).expect("utf-8");
        assert_eq!(text.lines().count(), 4);
        assert!(text
            .lines()
            .all(|l| l.starts_with("{\"time\":") && l.ends_with('}')));
        // Turned off: nothing is gathered.
        log.install(None, 1000, Duration::from_millis(100));
        assert!(!log.is_on());
        assert_eq!(add(&mut log, 1, 200, t0), Tally::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writer_appends_and_stops() {
        let (dir, path) = scratch("writer");
        std::fs::write(&path, b"kept\n").expect("write");
        let file = open(&path).expect("open");
        let (queue, handle) = spawn_writer().expect("spawn");
        let mut log = AccessLog::new(Some(queue.clone()));
        log.install(Some(file), 64 * 1024, Duration::from_secs(1));
        add(&mut log, 1, 200, Instant::now());
        add(&mut log, 1, 502, Instant::now());
        assert_eq!(
            log.flush(),
            Tally {
                written: 2,
                dropped: 0
            }
        );
        queue.stop();
        handle.join().expect("writer");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "kept");
        assert!(lines[2].contains("\"status\":502"));
        assert!(open(&dir.join("missing/x.log")).is_err());
        // The process's own outputs, duplicated (by name they cannot be opened when they are
        // sockets).
        assert!(open(Path::new("/dev/stdout")).is_ok());
        assert!(open(Path::new("/dev/stderr")).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
