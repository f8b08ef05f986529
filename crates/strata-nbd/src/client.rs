//! A minimal NBD client: fixed newstyle, OPT_GO, simple replies, one request at a time.
//! It exists for strata's own tools and tests (crash tests drive a server they kill), not as
//! a general client: libnbd, qemu and the kernel are the clients users run.

use crate::proto::*;
use std::io::{Error, ErrorKind, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

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
        if stream.read_u64().await? != NBDMAGIC || stream.read_u64().await? != IHAVEOPT {
            return Err(Error::new(ErrorKind::InvalidData, "not an NBD server"));
        }
        let _hs = stream.read_u16().await?;
        stream.write_u32(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).await?;
        let mut data = (export.len() as u32).to_be_bytes().to_vec();
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        let mut opt = IHAVEOPT.to_be_bytes().to_vec();
        opt.extend_from_slice(&OPT_GO.to_be_bytes());
        opt.extend_from_slice(&(data.len() as u32).to_be_bytes());
        opt.extend_from_slice(&data);
        stream.write_all(&opt).await?;
        let (mut size, mut flags) = (0, 0);
        loop {
            if stream.read_u64().await? != OPT_REPLY_MAGIC {
                return Err(Error::new(ErrorKind::InvalidData, "bad option reply magic"));
            }
            let _opt = stream.read_u32().await?;
            let kind = stream.read_u32().await?;
            let len = stream.read_u32().await? as usize;
            let mut d = vec![0; len];
            stream.read_exact(&mut d).await?;
            match kind {
                REP_ACK => break,
                REP_INFO if d.len() >= 12 && d[..2] == INFO_EXPORT.to_be_bytes() => {
                    size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                    flags = u16::from_be_bytes(d[10..12].try_into().unwrap());
                }
                REP_INFO => {}
                k => {
                    return Err(Error::other(format!(
                        "export {export:?} refused ({k:#x}): {}",
                        String::from_utf8_lossy(&d)
                    )))
                }
            }
        }
        Ok(Client { stream, size, flags, cookie: 0 })
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

    /// Sends NBD_CMD_DISC and closes.
    pub async fn disconnect(mut self) -> Result<()> {
        let req = Request { flags: 0, kind: CMD_DISC, cookie: 0, offset: 0, length: 0 };
        self.stream.write_all(&req.encode()).await?;
        self.stream.shutdown().await
    }
}
