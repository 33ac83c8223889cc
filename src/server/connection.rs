//! One client connection: read frames, hand each to a handler task, write the answers
//! back in request order (clients pipeline up to `max.in.flight.requests.per.connection`).
//!
//! A frame longer than `socket.request.max.bytes` (or than `queued.max.request.bytes`),
//! or one whose header does not decode, closes the connection with a log line and a
//! counter; it never stalls other connections or panics the shard.
//!
//! Memory: before a frame's body is read, its declared length is reserved from the
//! broker-wide request byte budget (`queued.max.request.bytes`, `Admission`), as
//! Kafka's memory pool does; while the budget cannot cover it the connection stops
//! reading. A reserved frame can always be read to its end, so large requests never
//! wait on one another's partial frames. The request holds its reservation until its
//! handler is done. The buffer itself starts at `frame_read_initial_bytes_max` at most
//! and doubles as bytes arrive, so a frame declared long and sent slowly (or never)
//! holds about what arrived. A connection that sends nothing for
//! `connections.max.idle.ms` with no request of its own in flight (or waits that long
//! for budget) is closed.

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use glommio::task::JoinHandle;

use crate::model::limits;
use crate::protocol::zero_copy::{Response, ResponsePart};
use crate::protocol::{check_frame_len, decode_frame, ProtocolError};

use super::admission::{ByteReservation, ConnectionPermit};
use super::context::ShardContext;
use super::handlers;

/// How often a connection waiting for request byte budget tries again.
const queued_bytes_retry_interval_ms: u64 = 2;

/// An answer still being computed, or the signal to hang up.
enum Pending {
    Answer(JoinHandle<Result<Option<Response>, ProtocolError>>),
}

/// Why reading a connection stopped.
enum ReadEnd {
    /// EOF, reset or a read error: the client left.
    Closed,
    /// Nothing arrived for connections.max.idle.ms with no request in flight, or no
    /// budget for that long.
    Idle,
}

/// Read at least one byte into `buf` (Ok(0): EOF). The socket's read timeout is
/// connections.max.idle.ms: a timeout while a request of this connection is in flight
/// (a long poll, a rebalance) is no idleness, so the read goes on.
async fn read_some<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut [u8],
    pending: &Cell<usize>,
) -> Result<usize, ReadEnd> {
    loop {
        match reader.read(buf).await {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                if pending.get() == 0 {
                    return Err(ReadEnd::Idle);
                }
            }
            Err(_) => return Err(ReadEnd::Closed),
        }
    }
}

/// Fill `buf` completely.
async fn read_full<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8], pending: &Cell<usize>) -> Result<(), ReadEnd> {
    let mut filled = 0;
    while filled < buf.len() {
        match read_some(reader, &mut buf[filled..], pending).await? {
            0 => return Err(ReadEnd::Closed),
            n => filled += n,
        }
    }
    Ok(())
}

/// Take `bytes` of the request byte budget, waiting (not reading) while it is used up;
/// Idle after connections.max.idle.ms without it.
async fn reserve(ctx: &ShardContext, bytes: usize) -> Result<ByteReservation, ReadEnd> {
    let started = Instant::now();
    loop {
        if let Some(r) = ctx.admission.try_reserve(bytes) {
            return Ok(r);
        }
        if started.elapsed() >= Duration::from_millis(ctx.config.connections_max_idle_ms) || ctx.stopping.get() {
            return Err(ReadEnd::Idle);
        }
        glommio::timer::sleep(Duration::from_millis(queued_bytes_retry_interval_ms)).await;
    }
}

/// Read a frame body of `len` bytes, once the request byte budget covers it: the
/// buffer grows (doubling) as bytes arrive. Returns the frame and its reservation.
async fn read_frame<R: AsyncRead + Unpin>(
    ctx: &ShardContext,
    reader: &mut R,
    len: usize,
    pending: &Cell<usize>,
) -> Result<(Bytes, ByteReservation), ReadEnd> {
    let reservation = reserve(ctx, len).await?;
    let mut buf = vec![0u8; len.min(limits::frame_read_initial_bytes_max)];
    let mut filled = 0;
    while filled < len {
        if filled == buf.len() {
            let grown = len.min(buf.len().saturating_mul(2));
            let mut bigger = vec![0u8; grown];
            bigger[..filled].copy_from_slice(&buf[..filled]);
            buf = bigger;
        }
        match read_some(reader, &mut buf[filled..], pending).await? {
            0 => return Err(ReadEnd::Closed),
            n => filled += n,
        }
    }
    assert_eq!(buf.len(), len);
    assert_eq!(reservation.bytes(), len, "a frame is covered by its reservation");
    Ok((Bytes::from(buf), reservation))
}

pub async fn serve(ctx: Rc<ShardContext>, stream: TcpStream, permit: ConnectionPermit) {
    let _permit = permit; // this connection's place under max.connections, until it ends
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(ctx.config.connections_max_idle_ms)));
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
    // Requests of this connection read and not yet answered.
    let pending = Rc::new(Cell::new(0usize));
    // Client quotas (KIP-219): the writer sets `muted_until` after sending a throttled
    // response; the reader reads no further request before then. A connection once
    // throttled is served as Kafka serves every connection: the next request is read
    // only when every answer is sent (else a pipelining client would have many requests
    // read, and measured, before the mute begins). `unsent` counts requests read and
    // not yet answered on the socket; `sent_notify` wakes a reader waiting for it to be 0.
    let muted_until: Rc<Cell<Option<Instant>>> = Rc::new(Cell::new(None));
    let throttled = Rc::new(Cell::new(false));
    let unsent = Rc::new(Cell::new(0usize));
    let sent_notify: Rc<Cell<Option<futures::channel::oneshot::Sender<()>>>> = Rc::new(Cell::new(None));
    let writer_done = Rc::new(Cell::new(false));

    let writer_task = {
        let ctx = ctx.clone();
        let peer = peer.clone();
        let pending = pending.clone();
        let muted_until = muted_until.clone();
        let (throttled, unsent, sent_notify) = (throttled.clone(), unsent.clone(), sent_notify.clone());
        let writer_done = writer_done.clone();
        glommio::spawn_local(async move {
            let counters = ctx.metrics.shard(ctx.id);
            let answered = || {
                unsent.set(unsent.get().saturating_sub(1));
                if unsent.get() == 0 {
                    if let Some(tx) = sent_notify.take() {
                        let _ = tx.send(());
                    }
                }
            };
            while let Some(Pending::Answer(task)) = rx.recv().await {
                let answer = task.await;
                pending.set(pending.get().saturating_sub(1));
                match answer {
                    Some(Ok(Some(response))) => {
                        counters.bytes_out.fetch_add(response.len_bytes(), Ordering::Relaxed);
                        let throttle_ms = response.throttle_ms;
                        if let Err(e) = write_response(&mut writer, fd, response).await {
                            tracing::debug!(%peer, error = %e, "write failed");
                            break;
                        }
                        if throttle_ms > 0 {
                            let until = Instant::now() + Duration::from_millis(throttle_ms);
                            muted_until.set(Some(muted_until.get().map_or(until, |u| u.max(until))));
                            throttled.set(true);
                        }
                        answered();
                    }
                    Some(Ok(None)) => answered(), // acks=0: no answer
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
            writer_done.set(true);
            drop(sent_notify.take()); // a reader waiting for answers sees the writer gone
                                      // Wake the reader if it is still blocked on the socket.
                                      // SAFETY: fd is the connection's socket, still owned by the reader half.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        })
    };

    loop {
        if ctx.stopping.get() {
            break;
        }
        if throttled.get() {
            // Throttled (client quotas): one request at a time, and none while muted.
            while unsent.get() > 0 && !writer_done.get() {
                let (tx, rx) = futures::channel::oneshot::channel();
                sent_notify.set(Some(tx));
                if rx.await.is_err() {
                    break; // the writer is gone
                }
            }
            if let Some(until) = muted_until.take() {
                let now = Instant::now();
                if until > now {
                    glommio::timer::sleep(until - now).await;
                }
            }
        }
        let mut len = [0u8; 4];
        match read_full(&mut reader, &mut len, &pending).await {
            Ok(()) => {}
            Err(ReadEnd::Closed) => break, // EOF or reset: the client left
            Err(ReadEnd::Idle) => {
                counters.connections_idle_closed.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, "closing idle connection (connections.max.idle.ms)");
                break;
            }
        }
        let declared = i32::from_be_bytes(len);
        let len = match check_frame_len(declared) {
            Ok(len) if len <= ctx.admission.queued_bytes_max() => len,
            Ok(len) => {
                counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                if ctx.client_error_log_allowed() {
                    tracing::warn!(%peer, frame_bytes = len, "closing connection: frame longer than queued.max.request.bytes");
                }
                break;
            }
            Err(e) => {
                counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                if ctx.client_error_log_allowed() {
                    tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                }
                break;
            }
        };
        let (frame, reservation) = match read_frame(&ctx, &mut reader, len, &pending).await {
            Ok(read) => read,
            Err(end) => {
                counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                if matches!(end, ReadEnd::Idle) {
                    counters.connections_idle_closed.fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(%peer, expected_bytes = len, idle = matches!(end, ReadEnd::Idle), "connection closed inside a frame");
                break;
            }
        };
        counters.bytes_in.fetch_add(4 + len as u64, Ordering::Relaxed);
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut frame = match decode_frame(frame) {
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
        pending.set(pending.get() + 1);
        unsent.set(unsent.get() + 1);
        let task = {
            let ctx = ctx.clone();
            glommio::spawn_local(async move {
                let (api_key, started) = (frame.api_key, std::time::Instant::now());
                let answer = handlers::handle(&ctx, frame).await;
                drop(reservation); // the request's bytes go back to the budget
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
