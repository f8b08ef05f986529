//! A file on a full file system: a FUA write with O_DIRECT that finds no room fails with
//! ENOSPC and leaves the device serving (writes where the file has room, flushes), where a
//! buffered file's failed FUA write latches it as a failed flush does (see `FileDev`). Needs
//! root to mount a small tmpfs, and a kernel whose tmpfs takes O_DIRECT (6.6 on); skips with
//! why otherwise.

use strata_io::file::{FileDev, FileOptions};
use strata_io::{BlockDev, Buf, ErrorKind};

/// A 1 MiB tmpfs mounted on a fresh directory, unmounted on drop.
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    fn mount() -> Result<SmallFs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root: cannot mount a tmpfs".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(SmallFs(dir))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).status();
    }
}

/// Writes 64 KiB blocks with FUA into `dev`'s holes from 1 MiB on until one fails; that
/// error.
async fn fill(dev: &FileDev) -> strata_io::Error {
    for b in 16..64u64 {
        if let Err(e) = dev.write(b << 16, Buf::from_slice(&[b as u8; 1 << 16]), true).await {
            return e;
        }
    }
    panic!("4 MiB written to a 1 MiB file system");
}

#[test]
fn a_fua_write_the_full_disk_refuses_fails_alone_with_o_direct_and_latches_a_buffered_file() {
    let fs = match SmallFs::mount() {
        Ok(fs) => fs,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let path = fs.0.path().join("direct.img");
        let opts = FileOptions { direct: true, ..FileOptions::default() };
        std::fs::File::create(&path).unwrap().set_len(4 << 20).unwrap();
        let dev = match FileDev::open(&path, &opts) {
            Ok(dev) => dev,
            Err(e) => return eprintln!("skipped: this kernel's tmpfs takes no O_DIRECT: {e}"),
        };
        dev.write(0, Buf::from_slice(&[1; 8192]), true).await.unwrap();
        let e = fill(&dev).await;
        assert_eq!(e.kind, ErrorKind::NoSpace, "{e}");
        // Where the file has room it still takes writes, with FUA or without, and flushes.
        dev.write(0, Buf::from_slice(&[2; 4096]), true).await.expect("a FUA write after the refusal");
        dev.write(4096, Buf::from_slice(&[3; 4096]), false).await.unwrap();
        dev.flush().await.expect("a flush after the refusal");
        assert_eq!(&dev.read(0, Buf::zeroed(4096)).await.unwrap()[..], &[2; 4096][..]);
        drop(dev);
        std::fs::remove_file(&path).unwrap();

        let path = fs.0.path().join("buffered.img");
        std::fs::File::create(&path).unwrap().set_len(4 << 20).unwrap();
        let dev = FileDev::open(&path, &FileOptions { direct: false, ..FileOptions::default() }).unwrap();
        dev.write(0, Buf::from_slice(&[1; 4096]), true).await.unwrap();
        assert_eq!(fill(&dev).await.kind, ErrorKind::NoSpace);
        let e = dev.flush().await.expect_err("a buffered file's failed FUA write latches");
        assert!(e.context.contains("a flush failed earlier"), "{e}");
    });
}
