//! The connection cap of the gRPC port: at most `edge.max_connections`
//! accepted sockets at once; further ones are closed as soon as accepted,
//! before any TLS or HTTP/2 work is spent on them.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection holding one of the cap's places until dropped.
pub struct CappedStream {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for CappedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The accepted connections of `listener`, at most `max` open at once.
pub fn capped_incoming(
    listener: TcpListener,
    max: usize,
) -> impl Stream<Item = std::io::Result<CappedStream>> {
    let places = Arc::new(Semaphore::new(max));
    tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| {
        match accepted {
            Ok(stream) => match places.clone().try_acquire_owned() {
                Ok(permit) => {
                    let _ = stream.set_nodelay(true);
                    Some(Ok(CappedStream {
                        stream,
                        _permit: permit,
                    }))
                }
                Err(_) => {
                    tracing::warn!(
                        max_connections = max,
                        peer = ?stream.peer_addr().ok(),
                        "connection refused: edge.max_connections reached"
                    );
                    None // dropped: closed at once
                }
            },
            // Accept errors (out of file descriptors) are passed on; the
            // server logs them and keeps accepting.
            Err(e) => Some(Err(e)),
        }
    })
}
