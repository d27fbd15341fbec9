//! The response body the double returns: a complete buffer, or a channel of
//! chunks for watch streams (one JSON event per line), which can end with an
//! error to simulate a dropped connection.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::sync::mpsc;

/// Why a streamed body ended abnormally.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BodyError {
    /// The watch connection was dropped by fault injection.
    #[error("watch connection dropped by testkit fault injection")]
    Dropped,
}

enum Inner {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Result<Bytes, BodyError>>),
}

/// Response body of the in-process API server.
pub struct ResponseBody {
    inner: Inner,
}

impl ResponseBody {
    /// A complete body.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        Self {
            inner: Inner::Full(Some(bytes.into())),
        }
    }

    /// A streamed body fed by a channel.
    pub fn stream(rx: mpsc::Receiver<Result<Bytes, BodyError>>) -> Self {
        Self {
            inner: Inner::Stream(rx),
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match &mut self.get_mut().inner {
            Inner::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Inner::Stream(rx) => rx.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(&self.inner, Inner::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Inner::Full(None) => SizeHint::with_exact(0),
            Inner::Stream(_) => SizeHint::default(),
        }
    }
}
