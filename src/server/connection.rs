//! One client connection: read frames, hand each to a handler task, write the answers
//! back in request order (clients pipeline up to `max.in.flight.requests.per.connection`).
//!
//! A frame longer than `socket.request.max.bytes`, or one whose header does not decode,
//! closes the connection with a log line and a counter; it never stalls other
//! connections or panics the shard.

use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use bytes::BytesMut;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::task::JoinHandle;

use crate::model::limits;
use crate::protocol::zero_copy::{Response, ResponsePart};
use crate::protocol::{check_frame_len, decode_frame, ProtocolError};

use super::context::ShardContext;
use super::handlers;

/// An answer still being computed, or the signal to hang up.
enum Pending {
    Answer(JoinHandle<Result<Option<Response>, ProtocolError>>),
}

pub async fn serve(ctx: Rc<ShardContext>, stream: TcpStream) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
    let fd = stream.as_raw_fd();
    // Non-blocking, so that sendfile never blocks the core: it sends what the socket
    // buffer takes and says EAGAIN. glommio's io_uring reads and writes are unaffected
    // (the kernel arms a poll for them).
    // SAFETY: plain fcntl on a socket we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let client_host = stream.peer_addr().map(|a| format!("/{}", a.ip())).unwrap_or_default();
    let counters = ctx.metrics.shard(ctx.id);
    tracing::debug!(shard = ctx.id.0, %peer, "connection opened");
    let (mut reader, mut writer) = futures_lite::io::split(stream);
    let (tx, rx) = glommio::channels::local_channel::new_bounded::<Pending>(limits::connection_in_flight_max);

    let writer_task = {
        let ctx = ctx.clone();
        let peer = peer.clone();
        glommio::spawn_local(async move {
            let counters = ctx.metrics.shard(ctx.id);
            while let Some(Pending::Answer(task)) = rx.recv().await {
                match task.await {
                    Some(Ok(Some(response))) => {
                        counters.bytes_out.fetch_add(response.len_bytes(), Ordering::Relaxed);
                        if let Err(e) = write_response(&mut writer, fd, response).await {
                            tracing::debug!(%peer, error = %e, "write failed");
                            break;
                        }
                    }
                    Some(Ok(None)) => {} // acks=0: no answer
                    Some(Err(e)) => {
                        counters.bad_requests.fetch_add(1, Ordering::Relaxed);
                        if ctx.client_error_log_allowed() {
                            tracing::warn!(%peer, error = %e, "closing connection: bad request");
                        }
                        break;
                    }
                    None => break,
                }
            }
            let _ = writer.flush().await;
            // Wake the reader if it is still blocked on the socket.
            // SAFETY: fd is the connection's socket, still owned by the reader half.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        })
    };

    loop {
        if ctx.stopping.get() {
            break;
        }
        let mut len = [0u8; 4];
        match reader.read_exact(&mut len).await {
            Ok(()) => {}
            Err(_) => break, // EOF or reset: the client left
        }
        let len = match check_frame_len(i32::from_be_bytes(len)) {
            Ok(len) => len,
            Err(e) => {
                counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                if ctx.client_error_log_allowed() {
                    tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                }
                break;
            }
        };
        let mut frame = BytesMut::zeroed(len);
        if let Err(e) = reader.read_exact(&mut frame).await {
            counters.bad_frames.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, error = %e, expected_bytes = len, "connection closed inside a frame");
            break;
        }
        counters.bytes_in.fetch_add(4 + len as u64, Ordering::Relaxed);
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut frame = match decode_frame(frame.freeze()) {
            Ok(f) => f,
            Err(e) => {
                counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                if ctx.client_error_log_allowed() {
                    tracing::warn!(%peer, error = %e, "closing connection: bad request header");
                }
                break;
            }
        };
        frame.client_host.clone_from(&client_host);
        ctx.in_flight.set(ctx.in_flight.get() + 1);
        let task = {
            let ctx = ctx.clone();
            glommio::spawn_local(async move {
                let (api_key, started) = (frame.api_key, std::time::Instant::now());
                let answer = handlers::handle(&ctx, frame).await;
                ctx.metrics.record_request(ctx.id, api_key, started.elapsed());
                ctx.in_flight.set(ctx.in_flight.get() - 1);
                answer
            })
            .detach()
        };
        if tx.send(Pending::Answer(task)).await.is_err() {
            break; // the writer hung up
        }
    }
    drop(tx);
    let _ = writer_task.await;
    tracing::debug!(shard = ctx.id.0, %peer, "connection closed");
}

/// How long to wait before retrying a send the socket buffer had no room for, at first
/// and at most (the client is reading slower than we send).
const sendfile_backoff_us_min: u64 = 50;
const sendfile_backoff_us_max: u64 = 2_000;

/// Write one response: bytes through glommio, file ranges with sendfile straight from
/// the page cache to the socket (zero-copy). Parts go out strictly in order.
async fn write_response<W: futures_lite::AsyncWrite + Unpin>(
    writer: &mut W,
    fd: std::os::fd::RawFd,
    response: Response,
) -> std::io::Result<()> {
    for part in response.parts {
        match part {
            ResponsePart::Bytes(b) => writer.write_all(&b).await?,
            ResponsePart::File { file, position, length } => {
                writer.flush().await?;
                let mut offset = position as libc::off_t;
                let end = position + length;
                let mut backoff_us = sendfile_backoff_us_min;
                while (offset as u64) < end {
                    let remaining = (end - offset as u64) as usize;
                    // SAFETY: both fds are open for the duration of the call (the file is
                    // held by `file`, the socket by the connection); offset is ours.
                    let n = unsafe { libc::sendfile(fd, file.as_raw_fd(), &mut offset, remaining) };
                    if n > 0 {
                        backoff_us = sendfile_backoff_us_min;
                        continue;
                    }
                    if n == 0 {
                        // The file is shorter than planned (truncated under us): the frame
                        // can no longer be completed, so the connection must close.
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "segment shrank during send",
                        ));
                    }
                    let err = std::io::Error::last_os_error();
                    match err.raw_os_error() {
                        Some(libc::EAGAIN) => {
                            glommio::timer::sleep(std::time::Duration::from_micros(backoff_us)).await;
                            backoff_us = (backoff_us * 2).min(sendfile_backoff_us_max);
                        }
                        Some(libc::EINTR) => {}
                        _ => return Err(err),
                    }
                }
            }
        }
    }
    Ok(())
}
