//! One error type for the request path, and the one table that turns an error into what the
//! client sees.
//!
//! Every failure is classified once, where it happens, into an [`ErrorKind`] and a [`Side`];
//! `proxy/respond.rs` is the only place that writes an error response, from [`ErrorKind::status`],
//! [`ErrorKind::code`] and [`ErrorKind::message`]. The cause (an `io::Error`, a parse detail) goes
//! to the log, never to the client.

use std::fmt;
use std::io;

use crate::http1::{ChunkedError, ParseError};

/// Which side of the proxy failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The client (downstream).
    Downstream,
    /// An upstream server.
    Upstream,
    /// ringway itself.
    Internal,
}

/// What went wrong, as far as the response and the connection are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed request syntax or framing.
    BadRequest,
    /// The request head or a header field count is over its limit.
    HeadTooLarge,
    /// The request line is over its limit.
    UriTooLong,
    /// The request body is over its limit.
    BodyTooLarge,
    /// An Expect value other than 100-continue.
    ExpectationFailed,
    /// A method or transfer coding ringway does not implement (CONNECT, gzip coding).
    NotImplemented,
    /// An HTTP version other than 1.0 and 1.1.
    VersionNotSupported,
    /// No route matches the request.
    NoRoute,
    /// The client was too slow sending the head or the body.
    RequestTimeout,
    /// The client went away or broke the connection: nothing can be sent.
    ClientClosed,
    /// Every endpoint refused the connection, or none is known.
    UpstreamConnect,
    /// Connecting to an endpoint timed out.
    UpstreamConnectTimeout,
    /// The upstream did not answer (response head) or stalled (body) in time.
    UpstreamTimeout,
    /// The upstream closed or reset the connection before the response was complete.
    UpstreamClosed,
    /// The upstream's response is not valid HTTP/1.1 or its framing is ambiguous.
    UpstreamInvalid,
    /// ringway is shutting down and no longer takes this request.
    ShuttingDown,
    /// The matched route is in maintenance.
    Maintenance,
    /// The upstream's circuit breaker is open.
    CircuitOpen,
    /// The gateway-wide concurrency cap is reached (for this request's priority class).
    GatewaySaturated,
    /// Every endpoint of the upstream is at its connection limit (or out of tokens) and the
    /// upstream's queue is full, or the wait for a connection ran out.
    UpstreamSaturated,
    /// The upstream has no endpoint in rotation (none resolved, or all drained).
    NoEndpoint,
    /// The request's host is not the TLS server name (SNI) of its connection.
    Misdirected,
    /// A bug or resource failure inside ringway.
    Internal,
}

impl ErrorKind {
    /// Every kind, for tests and documentation.
    pub const ALL: [ErrorKind; 23] = [
        ErrorKind::BadRequest,
        ErrorKind::HeadTooLarge,
        ErrorKind::UriTooLong,
        ErrorKind::BodyTooLarge,
        ErrorKind::ExpectationFailed,
        ErrorKind::NotImplemented,
        ErrorKind::VersionNotSupported,
        ErrorKind::NoRoute,
        ErrorKind::RequestTimeout,
        ErrorKind::ClientClosed,
        ErrorKind::UpstreamConnect,
        ErrorKind::UpstreamConnectTimeout,
        ErrorKind::UpstreamTimeout,
        ErrorKind::UpstreamClosed,
        ErrorKind::UpstreamInvalid,
        ErrorKind::ShuttingDown,
        ErrorKind::Maintenance,
        ErrorKind::CircuitOpen,
        ErrorKind::GatewaySaturated,
        ErrorKind::UpstreamSaturated,
        ErrorKind::NoEndpoint,
        ErrorKind::Misdirected,
        ErrorKind::Internal,
    ];

    /// The one place an error becomes a status. `None`: the client is gone; send nothing.
    pub fn status(self) -> Option<u16> {
        Some(match self {
            ErrorKind::BadRequest => 400,
            ErrorKind::HeadTooLarge => 431,
            ErrorKind::UriTooLong => 414,
            ErrorKind::BodyTooLarge => 413,
            ErrorKind::ExpectationFailed => 417,
            ErrorKind::NotImplemented => 501,
            ErrorKind::VersionNotSupported => 505,
            ErrorKind::NoRoute => 404,
            ErrorKind::RequestTimeout => 408,
            ErrorKind::ClientClosed => return None,
            ErrorKind::UpstreamConnect => 502,
            ErrorKind::UpstreamConnectTimeout => 504,
            ErrorKind::UpstreamTimeout => 504,
            ErrorKind::UpstreamClosed => 502,
            ErrorKind::UpstreamInvalid => 502,
            ErrorKind::ShuttingDown => 503,
            ErrorKind::Maintenance => 503,
            ErrorKind::CircuitOpen => 503,
            ErrorKind::GatewaySaturated => 503,
            ErrorKind::UpstreamSaturated => 503,
            ErrorKind::NoEndpoint => 503,
            ErrorKind::Misdirected => 421,
            ErrorKind::Internal => 500,
        })
    }

    /// The envelope's machine-readable `code`.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::HeadTooLarge => "headers_too_large",
            ErrorKind::UriTooLong => "uri_too_long",
            ErrorKind::BodyTooLarge => "body_too_large",
            ErrorKind::ExpectationFailed => "expectation_failed",
            ErrorKind::NotImplemented => "not_implemented",
            ErrorKind::VersionNotSupported => "version_not_supported",
            ErrorKind::NoRoute => "no_route",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::ClientClosed => "client_closed",
            ErrorKind::UpstreamConnect => "upstream_unreachable",
            ErrorKind::UpstreamConnectTimeout => "upstream_connect_timeout",
            ErrorKind::UpstreamTimeout => "upstream_timeout",
            ErrorKind::UpstreamClosed => "upstream_closed",
            ErrorKind::UpstreamInvalid => "upstream_invalid_response",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::Maintenance => "maintenance",
            ErrorKind::CircuitOpen => "upstream_circuit_open",
            ErrorKind::GatewaySaturated => "gateway_saturated",
            ErrorKind::UpstreamSaturated => "upstream_saturated",
            ErrorKind::NoEndpoint => "no_upstream_endpoint",
            ErrorKind::Misdirected => "misdirected_request",
            ErrorKind::Internal => "internal_error",
        }
    }

    /// The envelope's human-readable `message`: a classification, never a detail.
    pub fn message(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "the request is malformed",
            ErrorKind::HeadTooLarge => "the request head is too large",
            ErrorKind::UriTooLong => "the request line is too long",
            ErrorKind::BodyTooLarge => "the request body is too large",
            ErrorKind::ExpectationFailed => "only the 100-continue expectation is supported",
            ErrorKind::NotImplemented => {
                "the request uses a method or coding ringway does not support"
            }
            ErrorKind::VersionNotSupported => "only HTTP/1.0 and HTTP/1.1 are supported here",
            ErrorKind::NoRoute => "no route for this request",
            ErrorKind::RequestTimeout => "the request was not received in time",
            ErrorKind::ClientClosed => "the client closed the connection",
            ErrorKind::UpstreamConnect => "the upstream could not be reached",
            ErrorKind::UpstreamConnectTimeout => "connecting to the upstream timed out",
            ErrorKind::UpstreamTimeout => "the upstream did not respond in time",
            ErrorKind::UpstreamClosed => "the upstream closed the connection",
            ErrorKind::UpstreamInvalid => "the upstream sent an invalid response",
            ErrorKind::ShuttingDown => "the gateway is shutting down",
            ErrorKind::Maintenance => "this route is down for maintenance",
            ErrorKind::CircuitOpen => "upstream circuit open",
            ErrorKind::GatewaySaturated => "gateway saturated",
            ErrorKind::UpstreamSaturated => "upstream saturated",
            ErrorKind::NoEndpoint => "no upstream endpoint is available",
            ErrorKind::Misdirected => "this connection cannot serve this host",
            ErrorKind::Internal => "internal error",
        }
    }

    /// Whether the client connection must close after this error's response. True for every
    /// error where the request stream may no longer be in sync (framing, limits, timeouts).
    pub fn closes_downstream(self) -> bool {
        !matches!(
            self,
            ErrorKind::NoRoute
                | ErrorKind::Maintenance
                | ErrorKind::CircuitOpen
                | ErrorKind::GatewaySaturated
                | ErrorKind::UpstreamSaturated
                | ErrorKind::NoEndpoint
                | ErrorKind::Misdirected
                | ErrorKind::UpstreamConnect
                | ErrorKind::UpstreamConnectTimeout
                | ErrorKind::UpstreamTimeout
                | ErrorKind::UpstreamClosed
                | ErrorKind::UpstreamInvalid
                | ErrorKind::Internal
        )
    }

    /// Whether an attempt that failed this way may be repeated on a fresh connection, given
    /// that it ran on a connection `reused` from the pool and no response byte arrived. Only
    /// a reused connection's early failure is retryable: the upstream likely closed it while
    /// idle and never saw the request.
    pub fn retryable(self, reused: bool) -> bool {
        reused && matches!(self, ErrorKind::UpstreamClosed)
    }
}

/// A classified failure with its cause, for the log.
pub struct Error {
    kind: ErrorKind,
    side: Side,
    cause: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl Error {
    /// An error of `kind` on `side` without a cause.
    pub fn new(kind: ErrorKind, side: Side) -> Self {
        Error {
            kind,
            side,
            cause: None,
        }
    }

    /// Attaches the underlying cause (logged, never sent).
    pub fn with_cause(
        mut self,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.cause = Some(cause.into());
        self
    }

    /// The classification.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The side that failed.
    pub fn side(&self) -> Side {
        self.side
    }

    /// A client-side failure from an I/O error while reading or writing the client.
    pub fn client_io(e: io::Error) -> Self {
        Error::new(ErrorKind::ClientClosed, Side::Downstream).with_cause(e)
    }

    /// An upstream-side failure from an I/O error on an established upstream connection: a
    /// timeout is [`ErrorKind::UpstreamTimeout`], anything else [`ErrorKind::UpstreamClosed`].
    pub fn upstream_io(e: io::Error) -> Self {
        let kind = if e.kind() == io::ErrorKind::TimedOut {
            ErrorKind::UpstreamTimeout
        } else {
            ErrorKind::UpstreamClosed
        };
        Error::new(kind, Side::Upstream).with_cause(e)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("side", &self.side)
            .field("cause", &self.cause.as_ref().map(|c| c.to_string()))
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.kind.code(), self.side)?;
        if let Some(cause) = &self.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

impl From<ParseError> for ErrorKind {
    /// A request head's parse error; a response head's is always [`ErrorKind::UpstreamInvalid`].
    fn from(e: ParseError) -> Self {
        match e {
            ParseError::Malformed(_) => ErrorKind::BadRequest,
            ParseError::HeadTooLarge | ParseError::TooManyHeaders => ErrorKind::HeadTooLarge,
            ParseError::UriTooLong => ErrorKind::UriTooLong,
            ParseError::UnsupportedTransferCoding | ParseError::UnsupportedMethod => {
                ErrorKind::NotImplemented
            }
            ParseError::ExpectationFailed => ErrorKind::ExpectationFailed,
            ParseError::UnsupportedVersion => ErrorKind::VersionNotSupported,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Malformed(why) => f.write_str(why),
            other => write!(f, "{other:?}"),
        }
    }
}

impl std::error::Error for ParseError {}

impl fmt::Display for ChunkedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid chunked body: {self:?}")
    }
}

impl std::error::Error for ChunkedError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        let expected: [(ErrorKind, Option<u16>, bool); 23] = [
            (ErrorKind::BadRequest, Some(400), true),
            (ErrorKind::HeadTooLarge, Some(431), true),
            (ErrorKind::UriTooLong, Some(414), true),
            (ErrorKind::BodyTooLarge, Some(413), true),
            (ErrorKind::ExpectationFailed, Some(417), true),
            (ErrorKind::NotImplemented, Some(501), true),
            (ErrorKind::VersionNotSupported, Some(505), true),
            (ErrorKind::NoRoute, Some(404), false),
            (ErrorKind::RequestTimeout, Some(408), true),
            (ErrorKind::ClientClosed, None, true),
            (ErrorKind::UpstreamConnect, Some(502), false),
            (ErrorKind::UpstreamConnectTimeout, Some(504), false),
            (ErrorKind::UpstreamTimeout, Some(504), false),
            (ErrorKind::UpstreamClosed, Some(502), false),
            (ErrorKind::UpstreamInvalid, Some(502), false),
            (ErrorKind::ShuttingDown, Some(503), true),
            (ErrorKind::Maintenance, Some(503), false),
            (ErrorKind::CircuitOpen, Some(503), false),
            (ErrorKind::GatewaySaturated, Some(503), false),
            (ErrorKind::UpstreamSaturated, Some(503), false),
            (ErrorKind::NoEndpoint, Some(503), false),
            (ErrorKind::Misdirected, Some(421), false),
            (ErrorKind::Internal, Some(500), false),
        ];
        for (kind, status, closes) in expected {
            assert_eq!(kind.status(), status, "{kind:?}");
            assert_eq!(kind.closes_downstream(), closes, "{kind:?}");
            assert!(!kind.code().is_empty() && !kind.message().is_empty());
        }
        assert_eq!(ErrorKind::ALL.len(), expected.len());
        let mut codes: Vec<_> = ErrorKind::ALL.iter().map(|k| k.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), ErrorKind::ALL.len(), "codes are unique");
    }

    #[test]
    fn only_reused_closed_connections_retry() {
        for kind in ErrorKind::ALL {
            assert!(!kind.retryable(false));
            assert_eq!(kind.retryable(true), kind == ErrorKind::UpstreamClosed);
        }
    }

    #[test]
    fn upstream_io_errors_are_classified() {
        let e = Error::upstream_io(io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(e.kind(), ErrorKind::UpstreamTimeout);
        let e = Error::upstream_io(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(e.kind(), ErrorKind::UpstreamClosed);
        assert!(e.kind().retryable(true));
    }

    #[test]
    fn parse_errors_map_to_statuses() {
        assert_eq!(
            ErrorKind::from(ParseError::TooManyHeaders).status(),
            Some(431)
        );
        assert_eq!(ErrorKind::from(ParseError::UriTooLong).status(), Some(414));
        assert_eq!(
            ErrorKind::from(ParseError::UnsupportedTransferCoding).status(),
            Some(501)
        );
        assert_eq!(
            ErrorKind::from(ParseError::Malformed("x")).status(),
            Some(400)
        );
    }
}
