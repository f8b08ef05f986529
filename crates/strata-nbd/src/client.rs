//! NBD clients: the negotiation every client goes through (`greet`, `start_tls`, `choose`),
//! and a minimal sequential client on top of it (fixed newstyle, OPT_GO, simple replies, one
//! request at a time) for strata's own tools and tests (crash tests drive a server they
//! kill). The remote origin device (`crate::remote`) negotiates through the same functions
//! and adds structured replies, many requests in flight and reconnection.

use crate::proto::*;
use std::any::Any;
use std::io::{Error, ErrorKind, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

pub struct Client<S> {
    stream: S,
    size: u64,
    flags: u16,
    cookie: u64,
}

/// An error the server answered with (its errno), as opposed to a broken connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerError(pub u32);

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server replied with errno {}", self.0)
    }
}

impl std::error::Error for ServerError {}

fn server_err(errno: u32) -> Error {
    Error::other(ServerError(errno))
}

impl Client<UnixStream> {
    pub async fn connect_unix(path: &std::path::Path, export: &str) -> Result<Self> {
        Client::handshake(UnixStream::connect(path).await?, export).await
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    pub async fn handshake(mut stream: S, export: &str) -> Result<Self> {
        greet(&mut stream).await?;
        // No block sizes asked: this client's tests send any alignment.
        let want = Want { export, structured: false, base_allocation: false, block_sizes: false };
        let info = choose(&mut stream, &want).await?;
        Ok(Client { stream, size: info.size, flags: info.flags, cookie: 0 })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn flags(&self) -> u16 {
        self.flags
    }

    async fn request(&mut self, kind: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) -> Result<()> {
        self.cookie += 1;
        let req = Request { flags, kind, cookie: self.cookie, offset, length };
        let mut b = req.encode().to_vec();
        b.extend_from_slice(payload);
        self.stream.write_all(&b).await?;
        if self.stream.read_u32().await? != SIMPLE_REPLY_MAGIC {
            return Err(Error::new(ErrorKind::InvalidData, "bad reply magic"));
        }
        let errno = self.stream.read_u32().await?;
        if self.stream.read_u64().await? != self.cookie {
            return Err(Error::new(ErrorKind::InvalidData, "reply for another request"));
        }
        if errno != 0 {
            return Err(server_err(errno));
        }
        Ok(())
    }

    pub async fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>> {
        self.request(CMD_READ, 0, offset, len, &[]).await?;
        let mut d = vec![0; len as usize];
        self.stream.read_exact(&mut d).await?;
        Ok(d)
    }

    pub async fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.request(CMD_WRITE, if fua { CMD_FLAG_FUA } else { 0 }, offset, data.len() as u32, data).await
    }

    pub async fn flush(&mut self) -> Result<()> {
        self.request(CMD_FLUSH, 0, 0, 0, &[]).await
    }

    pub async fn trim(&mut self, offset: u64, len: u32) -> Result<()> {
        self.request(CMD_TRIM, 0, offset, len, &[]).await
    }

    pub async fn write_zeroes(&mut self, offset: u64, len: u32, no_hole: bool) -> Result<()> {
        self.request(CMD_WRITE_ZEROES, if no_hole { CMD_FLAG_NO_HOLE } else { 0 }, offset, len, &[]).await
    }

    /// Sends NBD_CMD_DISC, closes its side, and waits for the server to close its own (as
    /// libnbd's `nbd_shutdown` does): the connection is then gone for the server too.
    pub async fn disconnect(mut self) -> Result<()> {
        let req = Request { flags: 0, kind: CMD_DISC, cookie: 0, offset: 0, length: 0 };
        self.stream.write_all(&req.encode()).await?;
        self.stream.shutdown().await?;
        let mut rest = [0u8; 512];
        while self.stream.read(&mut rest).await? > 0 {}
        Ok(())
    }
}

/// Any byte stream a client or server speaks NBD over: TCP, a Unix socket, or TLS over either.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// For `split`, to find a plain socket in a box.
    fn as_any(&self) -> &dyn Any;
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}
pub type BoxStream = Box<dyn Stream>;
pub type ReadBox = Box<dyn AsyncRead + Send + Unpin>;
pub type WriteBox = Box<dyn AsyncWrite + Send + Unpin>;

/// Splits a stream into halves for a reader and a writer: a TCP or Unix socket without a
/// lock (`into_split`), anything else (TLS) under `tokio::io::split`'s, taken on every poll.
pub fn split(s: BoxStream) -> (ReadBox, WriteBox) {
    fn halves<R, W>((r, w): (R, W)) -> (ReadBox, WriteBox)
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        (Box::new(r), Box::new(w))
    }
    let any = (*s).as_any(); // the stream's own type, not the box's
    if any.is::<TcpStream>() {
        halves(s.into_any().downcast::<TcpStream>().expect("a TcpStream").into_split())
    } else if any.is::<UnixStream>() {
        halves(s.into_any().downcast::<UnixStream>().expect("a UnixStream").into_split())
    } else {
        halves(tokio::io::split(s))
    }
}

/// What a client asks for in `choose`.
pub struct Want<'a> {
    pub export: &'a str,
    /// Ask for structured replies (the client must then parse chunks).
    pub structured: bool,
    /// Ask for the `base:allocation` meta context (needs `structured`).
    pub base_allocation: bool,
    /// Ask for the export's block sizes, promising to honour them.
    pub block_sizes: bool,
}

/// What the server agreed to for one export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Block size constraints: (minimum, preferred, maximum); defaults when not advertised.
    pub block: (u32, u32, u32),
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The id the server gave `base:allocation`, if selected.
    pub base_allocation: Option<u32>,
}

/// Block sizes a client assumes when the server advertises none (proto.md: 1, 4096, 32 MiB).
pub const DEFAULT_BLOCK: (u32, u32, u32) = (1, 4096, 32 << 20);

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidData, msg.into())
}

/// Reads the server's greeting and answers with the client flags (fixed newstyle, no zeroes).
pub async fn greet<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) -> Result<()> {
    if stream.read_u64().await? != NBDMAGIC || stream.read_u64().await? != IHAVEOPT {
        return Err(invalid("not an NBD server (or not fixed newstyle)"));
    }
    let hs = stream.read_u16().await?;
    if hs & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(invalid("the server does not speak fixed newstyle"));
    }
    stream.write_u32(CLIENT_FIXED_NEWSTYLE | (hs as u32 & CLIENT_NO_ZEROES)).await?;
    stream.flush().await
}

async fn send_option<S: AsyncWrite + Unpin>(stream: &mut S, opt: u32, data: &[u8]) -> Result<()> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    stream.write_all(&b).await?;
    stream.flush().await
}

/// One option reply: (type, data). Replies longer than 16 MiB are refused.
async fn option_reply<S: AsyncRead + Unpin>(stream: &mut S, opt: u32) -> Result<(u32, Vec<u8>)> {
    if stream.read_u64().await? != OPT_REPLY_MAGIC {
        return Err(invalid("bad option reply magic"));
    }
    if stream.read_u32().await? != opt {
        return Err(invalid("option reply for another option"));
    }
    let kind = stream.read_u32().await?;
    let len = stream.read_u32().await?;
    if len > 16 << 20 {
        return Err(invalid(format!("option reply of {len} bytes")));
    }
    let mut d = vec![0; len as usize];
    stream.read_exact(&mut d).await?;
    Ok((kind, d))
}

fn refused(what: &str, kind: u32, data: &[u8]) -> Error {
    let why = match kind {
        REP_ERR_UNSUP => "unsupported",
        REP_ERR_POLICY => "refused by policy",
        REP_ERR_INVALID => "invalid",
        REP_ERR_UNKNOWN => "unknown export",
        REP_ERR_SHUTDOWN => "server shutting down",
        REP_ERR_TLS_REQD => "TLS required",
        _ => "error",
    };
    let msg = String::from_utf8_lossy(data);
    // The server answered: a refusal is not an unreachable server, save one shutting down.
    let kind = match kind {
        REP_ERR_TLS_REQD | REP_ERR_POLICY => ErrorKind::PermissionDenied,
        REP_ERR_SHUTDOWN => ErrorKind::Other,
        _ => ErrorKind::InvalidInput,
    };
    Error::new(kind, format!("{what}: {why}{}{msg}", if msg.is_empty() { "" } else { ": " }))
}

/// Asks for TLS (NBD_OPT_STARTTLS); on success the caller runs the TLS handshake on the
/// stream and continues negotiating inside it.
pub async fn start_tls<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) -> Result<()> {
    send_option(stream, OPT_STARTTLS, &[]).await?;
    match option_reply(stream, OPT_STARTTLS).await? {
        (REP_ACK, _) => Ok(()),
        (kind, data) => Err(refused("STARTTLS", kind, &data)),
    }
}

/// Negotiates structured replies and `base:allocation` as `want` asks (each only if the
/// server agrees), then picks the export with OPT_GO, asking for its block sizes.
pub async fn choose<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, want: &Want<'_>) -> Result<ExportInfo> {
    let mut structured = false;
    let mut base_allocation = None;
    if want.structured {
        send_option(stream, OPT_STRUCTURED_REPLY, &[]).await?;
        structured = option_reply(stream, OPT_STRUCTURED_REPLY).await?.0 == REP_ACK;
    }
    let mut name = (want.export.len() as u32).to_be_bytes().to_vec();
    name.extend_from_slice(want.export.as_bytes());
    if structured && want.base_allocation {
        let mut d = name.clone();
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        d.extend_from_slice(BASE_ALLOCATION.as_bytes());
        send_option(stream, OPT_SET_META_CONTEXT, &d).await?;
        loop {
            match option_reply(stream, OPT_SET_META_CONTEXT).await? {
                (REP_META_CONTEXT, d) if d.len() >= 4 && &d[4..] == BASE_ALLOCATION.as_bytes() => {
                    base_allocation = Some(u32::from_be_bytes(d[..4].try_into().unwrap()));
                }
                (REP_META_CONTEXT, _) => {}
                (REP_ACK, _) => break,
                (kind, _) if kind & (1 << 31) != 0 => break,
                (kind, _) => return Err(invalid(format!("unexpected reply {kind:#x} to SET_META_CONTEXT"))),
            }
        }
    }
    let mut d = name;
    if want.block_sizes {
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    } else {
        d.extend_from_slice(&0u16.to_be_bytes());
    }
    send_option(stream, OPT_GO, &d).await?;
    let (mut size, mut flags, mut block) = (None, 0, DEFAULT_BLOCK);
    loop {
        match option_reply(stream, OPT_GO).await? {
            (REP_ACK, _) => break,
            (REP_INFO, d) if d.len() >= 12 && d[..2] == INFO_EXPORT.to_be_bytes() => {
                size = Some(u64::from_be_bytes(d[2..10].try_into().unwrap()));
                flags = u16::from_be_bytes(d[10..12].try_into().unwrap());
            }
            (REP_INFO, d) if d.len() >= 14 && d[..2] == INFO_BLOCK_SIZE.to_be_bytes() => {
                let v = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap());
                block = (v(2).max(1), v(6).max(v(2)).max(1), v(10).max(v(2)).max(1));
            }
            (REP_INFO, _) => {}
            (kind, data) => return Err(refused(&format!("export {:?}", want.export), kind, &data)),
        }
    }
    let size = size.ok_or_else(|| invalid("the server acknowledged GO without saying the export's size"))?;
    // Offsets past 2^63 - 1 have no meaning to the kernel's nbd driver or to qemu, and
    // block devices' sizes are signed; nor can a remote's end be computed past them.
    if size > i64::MAX as u64 {
        return Err(invalid(format!(
            "export {:?}: the server says it holds {size} bytes, more than the 2^63 - 1 an NBD export can hold",
            want.export
        )));
    }
    Ok(ExportInfo { size, flags, block, structured, base_allocation })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server that answers OPT_GO with an export of `size` bytes and no flags.
    async fn serve_size(mut s: tokio::io::DuplexStream, size: u64) {
        let mut b = NBDMAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        s.write_all(&b).await.unwrap();
        s.read_u32().await.unwrap();
        assert_eq!(s.read_u64().await.unwrap(), IHAVEOPT);
        assert_eq!(s.read_u32().await.unwrap(), OPT_GO);
        let mut d = vec![0; s.read_u32().await.unwrap() as usize];
        s.read_exact(&mut d).await.unwrap();
        let mut info = INFO_EXPORT.to_be_bytes().to_vec();
        info.extend_from_slice(&size.to_be_bytes());
        info.extend_from_slice(&TFLAG_HAS_FLAGS.to_be_bytes());
        for (kind, data) in [(REP_INFO, &info[..]), (REP_ACK, &[][..])] {
            let mut r = OPT_REPLY_MAGIC.to_be_bytes().to_vec();
            r.extend_from_slice(&OPT_GO.to_be_bytes());
            r.extend_from_slice(&kind.to_be_bytes());
            r.extend_from_slice(&(data.len() as u32).to_be_bytes());
            r.extend_from_slice(data);
            s.write_all(&r).await.unwrap();
        }
        // Held open until the client has read every reply.
        let _ = s.read_u8().await;
    }

    async fn size_taken(size: u64) -> Result<u64> {
        let (client, server) = tokio::io::duplex(4096);
        let server = tokio::spawn(serve_size(server, size));
        let taken = Client::handshake(client, "e").await.map(|c| c.size());
        server.await.unwrap();
        taken
    }

    #[tokio::test]
    async fn an_export_past_2_pow_63_is_refused_at_the_handshake() {
        assert_eq!(size_taken(i64::MAX as u64).await.unwrap(), i64::MAX as u64);
        for size in [1 << 63, u64::MAX] {
            let e = size_taken(size).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidData);
            assert!(e.to_string().contains(&format!("holds {size} bytes")), "{e}");
        }
    }
}
