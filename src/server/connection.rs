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
//! holds about what arrived. Socket reads go through a per-connection read-ahead
//! buffer (`connection_read_ahead_bytes`), so a small request costs one read; the
//! bytes read ahead of the next frame are not reserved, at most that buffer's size.
//! A connection that sends nothing for
//! `connections.max.idle.ms` with no request of its own in flight (or waits that long
//! for budget) is closed.

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use std::sync::Arc;

use futures::channel::oneshot;
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;

use crate::model::limits;
use crate::protocol::zero_copy::{Response, ResponsePart};
use crate::protocol::{check_frame_len, decode_frame, ProtocolError, RequestFrame};
use kafka_protocol::messages::ApiKey;

use super::admission::{ByteReservation, ConnectionPermit};
use super::context::ShardContext;
use super::handlers;
use super::listener::ListenerRuntime;
use super::sasl_gate::{Gate, SaslGate};
use crate::security::Principal;

/// How often a connection waiting for request byte budget tries again.
const queued_bytes_retry_interval_ms: u64 = 2;

type Answer = Result<Option<Response>, ProtocolError>;

/// An answer still being computed, or the signal to hang up.
enum Pending {
    Answer(oneshot::Receiver<Answer>),
}

/// Run `answer` on a task of its own and hand back where its answer arrives.
///
/// The task is detached at once and its answer comes back through a oneshot whose
/// both ends live on this shard. A glommio `JoinHandle` is never kept: glommio 0.9's
/// `JoinHandle::drop` destroys a finished task when it *reads* a reference count of
/// 0, while a waker dropped on another thread (a cross-shard reply's oneshot, the
/// coordinator's) counts down to 0 and only then takes a reference again to send it
/// home. A JoinHandle dropped in that window freed the task, and the waker freed it a
/// second time: the broker aborted with "free(): double free detected in tcache 2"
/// after 312 s at 95,000 records/s (bench/vs_kafka.sh's latency run, 2026-12-04).
/// A task with no JoinHandle is freed only by counting down, on its own thread.
fn spawn_answer(answer: impl std::future::Future<Output = Answer> + 'static) -> oneshot::Receiver<Answer> {
    let (tx, rx) = oneshot::channel();
    glommio::spawn_local(async move {
        let _ = tx.send(answer.await);
    })
    .detach();
    rx
}

/// Whether `frame` is a Produce with a transactional id (Produce v3 and later begin
/// with it: a nullable string, its length an int16 up to v8 and an unsigned varint of
/// length + 1 from v9, -1 and 0 meaning null). A body too short to say is not.
fn is_transactional_produce(frame: &RequestFrame) -> bool {
    if frame.api_key != ApiKey::Produce as i16 || frame.api_version < 3 {
        return false;
    }
    let body = &frame.body[..];
    if frame.api_version < 9 {
        return body.len() >= 2 && i16::from_be_bytes([body[0], body[1]]) > 0;
    }
    // Compact: uvarint length + 1; a first byte above 1 is a non-empty id (a
    // continuation bit means a longer one).
    body.first().is_some_and(|b| *b > 1)
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

/// A connection's reading side with read-ahead: one socket read takes up to
/// `connection_read_ahead_bytes`, so a small request's length prefix and body (and the
/// next request's, when the client pipelines) cost one system call, not two or more.
/// A destination at least as large as the buffer, with nothing read ahead, is read into
/// directly (a large body is not copied twice).
struct ReadAhead<R> {
    inner: R,
    buf: Box<[u8]>,
    /// What was read ahead and not handed out yet: `buf[start..end]`.
    start: usize,
    end: usize,
}

impl<R: AsyncRead + Unpin> ReadAhead<R> {
    fn new(inner: R) -> Self {
        Self { inner, buf: vec![0u8; limits::connection_read_ahead_bytes].into_boxed_slice(), start: 0, end: 0 }
    }

    /// Read at least one byte into `dst` (Ok(0): EOF, or an empty `dst`), what was read
    /// ahead first.
    async fn read_some(&mut self, dst: &mut [u8], pending: &Cell<usize>) -> Result<usize, ReadEnd> {
        if dst.is_empty() {
            return Ok(0);
        }
        if self.start == self.end {
            if dst.len() >= self.buf.len() {
                return read_some(&mut self.inner, dst, pending).await;
            }
            let n = read_some(&mut self.inner, &mut self.buf, pending).await?;
            self.start = 0;
            self.end = n;
        }
        let n = dst.len().min(self.end - self.start);
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        Ok(n)
    }

    /// Hand out up to `max` of the bytes read ahead, without reading.
    fn take_read_ahead(&mut self, max: usize) -> &[u8] {
        let n = max.min(self.end - self.start);
        let taken = &self.buf[self.start..self.start + n];
        self.start += n;
        taken
    }
}

/// Fill `buf` completely.
async fn read_full<R: AsyncRead + Unpin>(
    reader: &mut ReadAhead<R>,
    buf: &mut [u8],
    pending: &Cell<usize>,
) -> Result<(), ReadEnd> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read_some(&mut buf[filled..], pending).await? {
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

/// Read a frame body of `len` bytes, once the request byte budget covers it. Returns
/// the frame and its reservation.
async fn read_frame<R: AsyncRead + Unpin>(
    ctx: &ShardContext,
    reader: &mut ReadAhead<R>,
    len: usize,
    pending: &Cell<usize>,
) -> Result<(Bytes, ByteReservation), ReadEnd> {
    let reservation = reserve(ctx, len).await?;
    let buf = read_body(reader, len, pending).await?;
    assert_eq!(reservation.bytes(), len, "a frame is covered by its reservation");
    Ok((Bytes::from(buf), reservation))
}

/// Read a body of `len` bytes: first what was read ahead, appended (not zeroed first),
/// then from the socket into room zeroed just before, which grows (doubling) as bytes
/// arrive, from at most `frame_read_initial_bytes_max`. So a body is not zeroed whole and
/// then written over (`bench/callgrind.sh`: a quarter of the shard's instructions per
/// produced record at 16 KiB requests).
async fn read_body<R: AsyncRead + Unpin>(
    reader: &mut ReadAhead<R>,
    len: usize,
    pending: &Cell<usize>,
) -> Result<Vec<u8>, ReadEnd> {
    let first = len.min(limits::frame_read_initial_bytes_max);
    let mut buf = Vec::with_capacity(first);
    buf.extend_from_slice(reader.take_read_ahead(len));
    // buf[..filled] holds the body so far; buf[filled..] is zeroed room for the socket.
    let mut filled = buf.len();
    while filled < len {
        if filled == buf.len() {
            let grown = if filled < first { first } else { len.min(filled.saturating_mul(2)) };
            buf.resize(grown, 0);
        }
        match reader.read_some(&mut buf[filled..], pending).await? {
            0 => return Err(ReadEnd::Closed),
            n => filled += n,
        }
    }
    assert_eq!(buf.len(), len);
    Ok(buf)
}

pub async fn serve(ctx: Rc<ShardContext>, stream: TcpStream, permit: ConnectionPermit, listener: Arc<ListenerRuntime>) {
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
    tracing::debug!(shard = ctx.id.0, %peer, listener = %listener.name, "connection opened");
    let info = ConnectionInfo { peer: peer.clone(), client_host, fd };
    match listener.tls.clone() {
        None => run(ctx.clone(), stream, info, Transport::Plain, Principal::anonymous_arc(), listener).await,
        Some(tls) => {
            // The handshake reads under the socket's idle timeout like any request.
            let acceptor = futures_rustls::TlsAcceptor::from(tls.config());
            match acceptor.accept(stream).await {
                Ok(tls_stream) => {
                    // SSL: the client certificate's subject through
                    // ssl.principal.mapping.rules, or ANONYMOUS without a certificate.
                    // SASL_SSL: SASL decides (Kafka's rule).
                    let subject = tls_stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|chain| chain.first())
                        .and_then(|leaf| crate::security::tls::certificate_subject(leaf))
                        .filter(|_| listener.sasl.is_none());
                    let principal = match subject {
                        None => Some(Principal::anonymous_arc()),
                        Some(dn) => listener.principal_mapper.name(&dn).map(|name| Arc::new(Principal::user(name))),
                    };
                    match principal {
                        Some(principal) => {
                            run(ctx.clone(), tls_stream, info, Transport::Tls, principal, listener.clone()).await
                        }
                        // Kafka refuses a certificate no rule maps (NoMatchingRule).
                        None => {
                            ctx.metrics.shard(ctx.id).tls_certificates_unmapped.fetch_add(1, Ordering::Relaxed);
                            if ctx.client_error_log_allowed() {
                                tracing::warn!(%peer, listener = %listener.name,
                                    "closing connection: no ssl.principal.mapping.rules rule matches its certificate's subject");
                            }
                        }
                    }
                }
                Err(e) => {
                    ctx.metrics.shard(ctx.id).tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                    if ctx.client_error_log_allowed() {
                        tracing::warn!(%peer, listener = %listener.name, error = %e, "TLS handshake failed");
                    }
                }
            }
        }
    }
    tracing::debug!(shard = ctx.id.0, %peer, "connection closed");
}

/// What a connection knows of its socket.
pub(super) struct ConnectionInfo {
    pub(super) peer: String,
    /// The client's address as Kafka shows it in group descriptions ("/127.0.0.1").
    pub(super) client_host: String,
    /// The socket, for sendfile and for waking a blocked reader.
    pub(super) fd: std::os::fd::RawFd,
}

/// How response bytes reach the socket.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Transport {
    /// Plain TCP: file ranges go out with sendfile (zero-copy).
    Plain,
    /// TLS: everything goes through the TLS stream; file ranges are read into memory and
    /// encrypted (tuning.md says what that costs).
    Tls,
}

/// Serve requests on an established stream (plain or TLS) until it ends. The
/// `connection` fuzz target (fuzz_harness.rs) drives it over an in-memory stream.
pub(super) async fn run<S>(
    ctx: Rc<ShardContext>,
    stream: S,
    info: ConnectionInfo,
    transport: Transport,
    principal: Arc<Principal>,
    listener: Arc<ListenerRuntime>,
) where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let ConnectionInfo { peer, client_host, fd } = info;
    let counters = ctx.metrics.shard(ctx.id);
    let (reader, mut writer) = futures_lite::io::split(stream);
    let mut reader = ReadAhead::new(reader);
    let (tx, rx) = glommio::channels::local_channel::new_bounded::<Pending>(limits::connection_in_flight_max);
    // Requests of this connection read and not yet answered.
    let pending = Rc::new(Cell::new(0usize));
    let mut sasl = listener.sasl.clone().map(|settings| SaslGate::new(settings, principal.clone()));
    let mut principal = principal;
    // Client quotas (KIP-219): the writer sets `muted_until` after sending a throttled
    // response; the reader reads no further request before then. A connection whose
    // client has a quota (`quotas::applies`), or that was once throttled, is served as
    // Kafka serves every connection: the next request is read only when every answer is
    // sent (else a pipelining client would have several requests read, and measured,
    // before the mute begins). `unsent` counts requests read and not yet answered on the
    // socket; `sent_notify` wakes a reader waiting for it to be 0.
    let muted_until: Rc<Cell<Option<Instant>>> = Rc::new(Cell::new(None));
    let one_at_a_time = Rc::new(Cell::new(false));
    let unsent = Rc::new(Cell::new(0usize));
    let sent_notify: Rc<Cell<Option<futures::channel::oneshot::Sender<()>>>> = Rc::new(Cell::new(None));
    let writer_done = Rc::new(Cell::new(false));

    let writer_task = {
        let ctx = ctx.clone();
        let peer = peer.clone();
        let pending = pending.clone();
        let muted_until = muted_until.clone();
        let (one_at_a_time, unsent, sent_notify) = (one_at_a_time.clone(), unsent.clone(), sent_notify.clone());
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
                let answer = task.await.ok();
                pending.set(pending.get().saturating_sub(1));
                match answer {
                    Some(Ok(Some(response))) => {
                        counters.bytes_out.fetch_add(response.len_bytes(), Ordering::Relaxed);
                        let throttle_ms = response.throttle_ms;
                        if let Err(e) = write_response(&mut writer, fd, transport, response).await {
                            tracing::debug!(%peer, error = %e, "write failed");
                            break;
                        }
                        // rustls keeps the records a busy socket did not take until the
                        // next write or flush: without a flush a response's tail would
                        // wait for the next response.
                        if transport == Transport::Tls && writer.flush().await.is_err() {
                            break;
                        }
                        if throttle_ms > 0 {
                            let until = Instant::now() + Duration::from_millis(throttle_ms);
                            muted_until.set(Some(muted_until.get().map_or(until, |u| u.max(until))));
                            one_at_a_time.set(true);
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
            let _ = writer.close().await;
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
        if one_at_a_time.get() {
            // A client with a quota: one request at a time, and none while muted.
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
        // Before authentication a frame is at most a SASL token's worth (Kafka's
        // sasl.server.max.receive.size): an unauthenticated client cannot make the
        // broker reserve the request budget.
        let frame_max = match &sasl {
            Some(gate) if !gate.authenticated() => crate::security::sasl::sasl_token_bytes_max + 1024,
            _ => ctx.admission.queued_bytes_max(),
        };
        let len = match check_frame_len(declared) {
            Ok(len) if len <= frame_max => len,
            Ok(len) => {
                counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                if ctx.client_error_log_allowed() {
                    tracing::warn!(%peer, frame_bytes = len, frame_bytes_max = frame_max, "closing connection: frame too long");
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
        // After SaslHandshake v0 the frame is a bare SASL token, not a request: the gate
        // decides on it alone. A request is decoded, then passed through the gate.
        let (decision, request) = match &mut sasl {
            Some(gate) if gate.expects_raw_token() => (gate.admit_raw_token(&ctx, &frame, &peer), None),
            _ => {
                let mut decoded = match decode_frame(frame) {
                    Ok(f) => f,
                    Err(e) => {
                        counters.bad_frames.fetch_add(1, Ordering::Relaxed);
                        if ctx.client_error_log_allowed() {
                            tracing::warn!(%peer, error = %e, "closing connection: bad request header");
                        }
                        break;
                    }
                };
                decoded.client_host.clone_from(&client_host);
                decoded.listener = listener.name.clone();
                let decision = sasl.as_mut().map_or(Gate::Pass, |gate| gate.admit(&ctx, &decoded, &peer));
                (decision, Some(decoded))
            }
        };
        match decision {
            Gate::Pass => {}
            Gate::Answer { response, then_close, delay_ms } => {
                if let Some(gate) = &sasl {
                    principal = gate.principal();
                }
                pending.set(pending.get() + 1);
                let task = spawn_answer(async move {
                    if delay_ms > 0 {
                        glommio::timer::sleep(Duration::from_millis(delay_ms)).await;
                    }
                    Ok(Some(Response::from(response)))
                });
                if tx.send(Pending::Answer(task)).await.is_err() || then_close {
                    break;
                }
                continue;
            }
            Gate::Close(why) => {
                counters.sasl_authentication_failures.fetch_add(1, Ordering::Relaxed);
                if ctx.client_error_log_allowed() {
                    tracing::warn!(%peer, listener = %listener.name, "closing connection: {why}");
                }
                break;
            }
        }
        let Some(mut frame) = request else {
            break; // the gate answers or closes on a bare token; it never passes one on
        };
        frame.principal = principal.clone();
        if !one_at_a_time.get() && super::quotas::applies(&ctx, &frame) {
            one_at_a_time.set(true);
        }
        ctx.in_flight.set(ctx.in_flight.get() + 1);
        pending.set(pending.get() + 1);
        unsent.set(unsent.get() + 1);
        // A transactional Produce is served before the next request is read, as Kafka
        // serves every request: its first batch in a partition waits for the
        // coordinator's verification (KIP-890), and a pipelined next batch of the same
        // producer would otherwise reach the partition first, out of sequence (a fatal
        // OUT_OF_ORDER_SEQUENCE_NUMBER for the client).
        let (served, served_wait) = if is_transactional_produce(&frame) {
            let (tx, rx) = futures::channel::oneshot::channel::<()>();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let task = {
            let ctx = ctx.clone();
            spawn_answer(async move {
                let (api_key, started) = (frame.api_key, std::time::Instant::now());
                let answer = handlers::handle(&ctx, frame).await;
                drop(reservation); // the request's bytes go back to the budget
                ctx.metrics.record_request(ctx.id, api_key, started.elapsed());
                ctx.in_flight.set(ctx.in_flight.get() - 1);
                drop(served);
                answer
            })
        };
        if tx.send(Pending::Answer(task)).await.is_err() {
            break; // the writer hung up
        }
        if let Some(served) = served_wait {
            let _ = served.await; // the sender goes with the handler's task
        }
    }
    drop(tx);
    let _ = writer_task.await;
}

/// A file range whose socket buffer is full (sendfile says EAGAIN): its next bytes, up
/// to this many, are copied through the io_uring writer, whose send completes as soon
/// as the client has read enough to make room (TCP wakes a writer once about a third of
/// the buffer is free), and sendfile fills the rest of that room without a copy. glommio
/// has no public wait for writability; the timer this replaced guessed, doubling from
/// 50 us to 2 ms, and slept on past the moment the socket drained. One page: a 4 MiB
/// range sent to a client that lags copies ~5% of it (the unit test below).
const sendfile_stall_copy_bytes: u64 = 4 * 1024;

/// Write one response: bytes through glommio, file ranges with sendfile straight from
/// the page cache to the socket (zero-copy). Parts go out strictly in order.
async fn write_response<W: futures_lite::AsyncWrite + Unpin>(
    writer: &mut W,
    fd: std::os::fd::RawFd,
    transport: Transport,
    response: Response,
) -> std::io::Result<()> {
    for part in response.parts {
        match part {
            ResponsePart::Bytes(b) => writer.write_all(&b).await?,
            ResponsePart::File { file, position, length } if transport == Transport::Tls => {
                copy_file_range_to(writer, &file, position, length).await?
            }
            ResponsePart::File { file, position, length } => {
                writer.flush().await?;
                let mut offset = position as libc::off_t;
                let end = position + length;
                while (offset as u64) < end {
                    let remaining = (end - offset as u64) as usize;
                    // SAFETY: both fds are open for the duration of the call (the file is
                    // held by `file`, the socket by the connection); offset is ours.
                    let n = unsafe { libc::sendfile(fd, file.as_raw_fd(), &mut offset, remaining) };
                    if n > 0 {
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
                            let n = (remaining as u64).min(sendfile_stall_copy_bytes);
                            copy_file_range_to(writer, &file, offset as u64, n).await?;
                            offset += n as libc::off_t;
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

/// A file range read from the page cache in chunks and written through `writer`: a TLS
/// connection's (sendfile cannot encrypt), and a plain one's while its socket buffer is
/// full. The reads are plain `pread`s of pages a recent append or the fetch's own
/// read-ahead brought in.
async fn copy_file_range_to<W: futures_lite::AsyncWrite + Unpin>(
    writer: &mut W,
    file: &std::fs::File,
    position: u64,
    length: u64,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; (length as usize).min(limits::tls_file_copy_chunk_bytes)];
    let (mut at, end) = (position, position + length);
    while at < end {
        let want = ((end - at) as usize).min(buf.len());
        let n = file.read_at(&mut buf[..want], at)?;
        if n == 0 {
            // The file is shorter than planned (truncated under us): the frame can no
            // longer be completed, so the connection must close.
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "segment shrank during send"));
        }
        writer.write_all(&buf[..n]).await?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A socket that hands out its bytes at most `chunk` at a time, counting reads.
    struct Chunked {
        data: Vec<u8>,
        at: usize,
        chunk: usize,
        reads: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.chunk).min(self.data.len() - self.at);
            let at = self.at;
            buf[..n].copy_from_slice(&self.data[at..at + n]);
            self.at += n;
            self.reads += 1;
            Poll::Ready(Ok(n))
        }
    }

    /// Frames as a client pipelines them: length prefix, body.
    fn frames(sizes: &[usize]) -> (Vec<u8>, Vec<Vec<u8>>) {
        let bodies: Vec<Vec<u8>> =
            sizes.iter().enumerate().map(|(i, n)| (0..*n).map(|j| (i * 31 + j * 7) as u8).collect()).collect();
        let mut wire = Vec::new();
        for b in &bodies {
            wire.extend_from_slice(&(b.len() as u32).to_be_bytes());
            wire.extend_from_slice(b);
        }
        (wire, bodies)
    }

    /// Read every frame back through the read-ahead: length prefix, then body.
    fn read_back(wire: Vec<u8>, chunk: usize, count: usize) -> (Vec<Vec<u8>>, usize, bool) {
        let mut r = ReadAhead::new(Chunked { data: wire, at: 0, chunk, reads: 0 });
        let pending = Cell::new(0);
        futures::executor::block_on(async {
            let mut got = Vec::new();
            for _ in 0..count {
                let mut len = [0u8; 4];
                read_full(&mut r, &mut len, &pending).await.ok().expect("length prefix");
                let body = read_body(&mut r, u32::from_be_bytes(len) as usize, &pending).await.ok().expect("body");
                got.push(body);
            }
            let mut more = [0u8; 1];
            let eof = matches!(read_full(&mut r, &mut more, &pending).await, Err(ReadEnd::Closed));
            (got, r.inner.reads, eof)
        })
    }

    /// A fetched file range larger than the socket can hold while its client is not
    /// reading: sendfile fills the buffer and says EAGAIN, the stall copies go through
    /// the io_uring writer, and the client still reads every byte once, in order, with
    /// the response's own bytes around it.
    #[test]
    fn a_file_range_reaches_a_reader_that_lags_whole_and_in_order() {
        use std::io::{Read, Write};
        let range_bytes: usize = 4 * 1024 * 1024 + 12_345;
        let content: Vec<u8> = (0..range_bytes + 999).map(|i| (i % 251) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        std::fs::File::create(&path).unwrap().write_all(&content).unwrap();
        let (position, length) = (999u64, range_bytes as u64);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            // Nothing read for a while: the broker's socket buffer fills.
            std::thread::sleep(Duration::from_millis(300));
            let mut got = Vec::new();
            let mut chunk = vec![0u8; 7_777];
            loop {
                let n = s.read(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
            }
            got
        });
        let (accepted, _) = listener.accept().unwrap();
        let fd = accepted.as_raw_fd();
        // A 64 KiB send buffer (no autotuning) and non-blocking, as `serve` sets it.
        // SAFETY: plain socket options on a socket we own.
        unsafe {
            let size: libc::c_int = 64 * 1024;
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                &size as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
            libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK);
        }
        let file = Arc::new(std::fs::File::open(&path).unwrap());
        let response = Response {
            parts: vec![
                ResponsePart::Bytes(Bytes::from_static(b"head")),
                ResponsePart::File { file, position, length },
                ResponsePart::Bytes(Bytes::from_static(b"tail")),
            ],
            throttle_ms: 0,
        };
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(super::super::shard_io_memory_bytes)
            .spawn(move || async move {
                use std::os::fd::{FromRawFd, IntoRawFd};
                // SAFETY: the accepted socket's descriptor, handed over whole.
                let stream = unsafe { TcpStream::from_raw_fd(accepted.into_raw_fd()) };
                let (_reader, mut writer) = futures_lite::io::split(stream);
                write_response(&mut writer, fd, Transport::Plain, response).await.unwrap();
                writer.close().await.unwrap();
            })
            .unwrap()
            .join()
            .unwrap();
        let got = client.join().unwrap();
        let mut want = b"head".to_vec();
        want.extend_from_slice(&content[position as usize..position as usize + range_bytes]);
        want.extend_from_slice(b"tail");
        assert_eq!(got.len(), want.len(), "bytes received");
        let first_difference = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(first_difference, None, "the received bytes differ from the range's");
    }

    #[test]
    fn read_ahead_returns_every_frame_intact_however_the_socket_splits_them() {
        let big = limits::connection_read_ahead_bytes;
        let sizes = [0, 1, 9, 300, big - 4, big, big + 1, 3 * big + 17, 5];
        for chunk in [1, 3, 4, 5, 4096, big - 1, big, big + 1, usize::MAX] {
            let (wire, bodies) = frames(&sizes);
            let (got, _, eof) = read_back(wire, chunk, sizes.len());
            assert!(got == bodies, "chunk {chunk}: frames differ");
            assert!(eof, "chunk {chunk}: EOF after the last frame");
        }
    }

    #[test]
    fn a_body_beyond_the_first_allocation_grows_intact() {
        let first = limits::frame_read_initial_bytes_max;
        let sizes = [7, 2 * first + 3, first, first + 1, 4 * first, 11];
        for chunk in [4096, limits::connection_read_ahead_bytes + 1, 300_001, usize::MAX] {
            let (wire, bodies) = frames(&sizes);
            let (got, _, eof) = read_back(wire, chunk, sizes.len());
            assert!(got == bodies, "chunk {chunk}: frames differ");
            assert!(eof, "chunk {chunk}: EOF after the last frame");
        }
    }

    #[test]
    fn small_pipelined_frames_cost_one_socket_read_between_them() {
        // Twenty 500-byte requests sent at once: the first read takes all of them.
        let (wire, bodies) = frames(&[500; 20]);
        let (got, reads, _) = read_back(wire, usize::MAX, 20);
        assert!(got == bodies);
        assert_eq!(reads, 2, "one read for the twenty frames, one for EOF");
    }
}
