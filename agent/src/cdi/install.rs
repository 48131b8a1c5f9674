//! Files on the node: the limiter and the preload list in the library directory that a spec's
//! mounts name, and the spec itself. Every file is written beside its destination and renamed
//! over it, so a container starting meanwhile sees the old file or the new one, never half of
//! one (and processes that have the old limiter mapped keep its inode).

use std::{
    fs,
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use object::{Object, ObjectKind, ObjectSymbol};

use super::{
    error::CdiError,
    names::{LIMITER_FILE, PRELOAD_FILE},
    spec::LIMITER_IN_CONTAINER,
};

/// Symbols that make a file the limiter (not another library by mistake).
const LIMITER_SYMBOLS: [&str; 2] = ["cuMemAlloc_v2", "dlsym"];

/// Where `cdi install` takes the limiter from by default: beside the binary (a build's
/// `target/release/`), or `../lib/vgpu-agent/` from it (the image's `/usr/lib/vgpu-agent/`).
pub fn default_limiter() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [
        dir.join(LIMITER_FILE),
        dir.join("../lib/vgpu-agent").join(LIMITER_FILE),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Checks that `path` is the limiter: an ELF shared object exporting the CUDA hooks.
pub fn check_limiter(path: &Path) -> Result<(), CdiError> {
    let bad = |why: String| CdiError::NotLimiter {
        path: path.to_owned(),
        why,
    };
    let data = fs::read(path).map_err(|e| bad(e.to_string()))?;
    let file = object::File::parse(&*data).map_err(|e| bad(format!("not ELF: {e}")))?;
    if file.kind() != ObjectKind::Dynamic {
        return Err(bad("not a shared library".into()));
    }
    let missing: Vec<&str> = LIMITER_SYMBOLS
        .iter()
        .copied()
        .filter(|want| {
            !file
                .dynamic_symbols()
                .any(|s| s.is_definition() && s.name() == Ok(*want))
        })
        .collect();
    if !missing.is_empty() {
        return Err(bad(format!("it does not export {}", missing.join(", "))));
    }
    Ok(())
}

/// Writes `contents` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomically(path: &Path, contents: &[u8], mode: u32) -> Result<(), CdiError> {
    let io = |source| CdiError::Write {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = dir {
        fs::create_dir_all(dir).map_err(io)?;
    }
    let name = path
        .file_name()
        .ok_or_else(|| io(std::io::Error::other("no file name")))?;
    let tmp = dir.unwrap_or(Path::new(".")).join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(contents)?;
        // The mode asked for, whatever the umask.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Makes the node's QoS board directory: every container writes the board in it, so it is
/// sticky and writable by all (mode 1777, as /tmp). A path that exists must be a directory (not
/// a link).
pub fn board_dir(dir: &Path) -> Result<(), CdiError> {
    shared_dir(dir, "a QoS board directory", 0o1777)
}

/// Makes the freeze pool's socket directory (root's, mode 0755: containers see it read-only and
/// connect to the daemon's socket in it) unless it is one already.
pub fn pool_dir(dir: &Path) -> Result<(), CdiError> {
    shared_dir(dir, "a freeze pool directory", 0o755)
}

/// Makes `dir` a directory of mode `mode`, or refuses what is there and is not a directory.
fn shared_dir(dir: &Path, what: &str, mode: u32) -> Result<(), CdiError> {
    let io = |source| CdiError::Write {
        path: dir.to_owned(),
        source,
    };
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(io(std::io::Error::other(format!(
                "not a directory ({what} must be one)"
            ))));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(io)?;
        }
        Err(e) => return Err(io(e)),
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map_err(io)
}

/// What `cdi install` wrote.
#[derive(Debug)]
pub struct Installed {
    pub limiter: PathBuf,
    pub preload: PathBuf,
}

/// Copies the limiter into `lib_dir` and writes the preload list beside it.
pub fn install(limiter: &Path, lib_dir: &Path) -> Result<Installed, CdiError> {
    check_limiter(limiter)?;
    let bytes = fs::read(limiter).map_err(|source| CdiError::Read {
        path: limiter.to_owned(),
        source,
    })?;
    let installed = Installed {
        limiter: lib_dir.join(LIMITER_FILE),
        preload: lib_dir.join(PRELOAD_FILE),
    };
    write_atomically(&installed.limiter, &bytes, 0o755)?;
    write_atomically(
        &installed.preload,
        format!("{LIMITER_IN_CONTAINER}\n").as_bytes(),
        0o644,
    )?;
    Ok(installed)
}
