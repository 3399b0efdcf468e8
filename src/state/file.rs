//! State files on disk: `DIR/<group or core>_<resource>.state`, written atomically (a
//! temporary file created 0600, written, fsynced, renamed over the old one, the directory
//! fsynced) so a crash at any point leaves the old file or the new one, never a mix.
//! Leftover temporary files (a crash during a write) are never read, and removed at start once
//! older than [`LEFTOVER_AGE`] (a younger one may be another process's write going on).
//!
//! Blocking I/O: called from `spawn_blocking` by `state::save` and `state::restore` (whose
//! `Loaded::read` decodes the files it opens).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file name of a resource's state.
pub fn name_of(group: &str, resource: &str) -> String {
    let group = if group.is_empty() { "core" } else { group };
    format!("{group}_{resource}.state")
}

/// The `(group, resource)` a state file's name says it holds (the inverse of [`name_of`]: a
/// group or resource name never contains `_`); `None` for any other name.
pub fn resource_of(name: &str) -> Option<(&str, &str)> {
    let (group, resource) = name.strip_suffix(".state")?.split_once('_')?;
    let group = if group == "core" { "" } else { group };
    (!resource.is_empty() && !resource.contains('_')).then_some((group, resource))
}

/// The temporary name `bytes` are written under before the rename: a new one each time (the
/// process id is 1 in every container; two pods may share a `hostPath` during a rollout), with
/// when the write began (`t<seconds since the epoch>`): the file is dated as old as its state
/// before the rename, so its time says nothing of the write (`open_all`).
fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    let began = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    name.push(format!(".tmp-t{}-{:016x}", began.as_secs(), fastrand::u64(..)));
    path.with_file_name(name)
}

/// When the write of a temporary file began, from its name ([`temporary`]); `None` for a name
/// of another form.
fn write_began(name: &str) -> Option<std::time::SystemTime> {
    let rest = &name[name.find(".state.tmp-t")? + ".state.tmp-t".len()..];
    let secs: u64 = rest.split('-').next()?.parse().ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// A leftover temporary file younger than this may be another process's write in progress:
/// [`open_all`] leaves it.
pub const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Writes `bytes` to `path` atomically (see the module doc).
/// `proven_at`: the file's modification time (when its state was last proven current: a
/// restore counts its staleness from it, `state::restore`); now when `None`.
pub fn write_atomic(
    path: &Path,
    bytes: &[u8],
    proven_at: Option<std::time::SystemTime>,
) -> std::io::Result<()> {
    let tmp = temporary(path);
    let written = (|| {
        let mut opts = OpenOptions::new();
        // Created here, never opened if something is in its place (a link, a FIFO).
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NOFOLLOW | libc::O_NONBLOCK);
        }
        let mut f = opts.open(&tmp)?;
        // A file the next start would refuse (a volume that maps owners or modes: NFS with
        // root_squash, SMB's file_mode): not written.
        if let Some(why) = untrusted(&f.metadata()?) {
            return Err(std::io::Error::other(format!(
                "the next start would not trust a file written here ({why}): warm restarts cannot work on this volume"
            )));
        }
        f.write_all(bytes)?;
        // Dated before the rename (a crash after it leaves a file as old as its state). A
        // temporary file so dated is not taken for a leftover: its name says when its write
        // began (`open_all`).
        if let Some(t) = proven_at {
            f.set_modified(t)?;
        }
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename itself must reach the disk (a power loss would otherwise undo it).
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Creates `dir` (0700) if needed. An existing directory keeps its mode (a volume's is the
/// operator's: its setgid bit and group are what an `fsGroup` relies on).
pub fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// Whether the proxy can write in `dir`: a probe file created (0600) and removed. A `hostPath`
/// volume the kubelet created is root-owned, and every save then failed with a warning per
/// resource and per sync, nothing saying why at start.
pub fn writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".write-probe-{}", std::process::id()));
    let mut o = fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(&probe)?;
    fs::remove_file(&probe)
}

/// Why a state file must not be read: it is not the proxy's own (another user's), or users
/// other than the proxy's may write it (anyone, or a group the proxy is not in; a group it is
/// in — a pod's `fsGroup` — is its own). Such a file could make the proxy serve objects the
/// upstream never had.
pub fn untrusted(meta: &fs::Metadata) -> Option<String> {
    if !meta.is_file() {
        return Some("not a regular file".into());
    }
    #[cfg(unix)]
    {
        use rustix::process::{getegid, geteuid, getgroups};
        use std::os::unix::fs::MetadataExt;
        let mut groups: Vec<u32> = getgroups().unwrap_or_default().iter().map(|g| g.as_raw()).collect();
        groups.push(getegid().as_raw());
        untrusted_by((meta.uid(), meta.gid(), meta.mode()), geteuid().as_raw(), &groups)
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

/// [`untrusted`] of a file owned by `(uid, gid)` with `mode`, read by the user `me` in
/// `groups`.
fn untrusted_by((uid, gid, mode): (u32, u32, u32), me: u32, groups: &[u32]) -> Option<String> {
    let mode = mode & 0o7777;
    if uid != me {
        Some(format!("not the proxy's own: owned by uid {uid}, the proxy runs as {me}"))
    } else if mode & 0o002 != 0 {
        Some(format!("anyone may write it (mode {mode:o})"))
    } else if mode & 0o020 != 0 && !groups.contains(&gid) {
        Some(format!("group {gid}, which the proxy is not in, may write it (mode {mode:o})"))
    } else {
        None
    }
}

/// One state file found: its name, and the open file with its metadata or why it is
/// unreadable.
pub type Found = (String, std::io::Result<(File, fs::Metadata)>);

/// The state files in `dir`; temporary files left by a crash are never read, and removed once
/// older than [`LEFTOVER_AGE`] (a younger one may be another process's write in progress).
pub fn open_all(dir: &Path) -> std::io::Result<Vec<Found>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.contains(".state.tmp-") {
            // When its write began, from its name: a write in progress dates its file in the
            // past (a stale state's time) before renaming it (a review: it was removed as a
            // leftover, mid-write, by another pod's start); its time for a name without one.
            let modified = write_began(&name).or_else(|| entry.metadata().and_then(|m| m.modified()).ok());
            // A time in the future (another host's clock, on a shared volume) is a write in
            // progress, not a leftover (it was removed as one: found by a review) — unless it
            // is further ahead than a write lasts (a clock set back since).
            let old = |t: std::time::SystemTime| match t.elapsed() {
                Ok(age) => age >= LEFTOVER_AGE,
                Err(ahead) => ahead.duration() >= LEFTOVER_AGE,
            };
            if modified.is_none_or(old) {
                let _ = fs::remove_file(entry.path());
            }
            continue;
        }
        if name.ends_with(".state") {
            let opened = open_file(&entry.path()).and_then(|f| f.metadata().map(|m| (f, m)));
            out.push((name, opened));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Opens a state file to read: not through a symbolic link, and without blocking (a FIFO put in
/// its place would otherwise hold the start for ever; its metadata then says it is not a file).
fn open_file(path: &Path) -> std::io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    opts.open(path)
}

/// Removes a file for good: the directory is synced after the unlink, as after a rename
/// (`write_atomic`), so a power loss cannot bring back a state the proxy removed because it
/// must not come back (found by a review: the unlinks were not made durable).
pub fn remove_durable(path: &Path) -> std::io::Result<()> {
    fs::remove_file(path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The names of the state files in `dir` (`*.state`; temporary files are not).
pub fn state_names(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".state") {
            out.push(name);
        }
    }
    Ok(out)
}

/// Removes the state of a resource that must not be on disk (excluded since it was written).
pub fn remove(dir: &Path, name: &str) {
    match remove_durable(&dir.join(name)) {
        Ok(()) => {
            tracing::info!(
                file = name,
                "state file removed: its resource is not written (--state-resources) or not cached"
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(file = name, error = %e, "could not remove an excluded resource's state file")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory the proxy cannot write is found at once (the probe leaves nothing behind).
    #[cfg(unix)]
    #[test]
    fn a_directory_the_proxy_cannot_write_is_found() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("kwc-state-ro-{}", fastrand::u64(..)));
        ensure_dir(&dir).unwrap();
        writable(&dir).unwrap();
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "the probe is removed");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o500)).unwrap();
        // root writes anywhere: the refusal is seen only as another user.
        let refused = writable(&dir);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let root =
            fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0).unwrap_or(false);
        assert!(root || refused.is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn written_files_are_private_and_replace_the_old_one() {
        let dir = std::env::temp_dir().join(format!("kwc-state-file-{}", fastrand::u64(..)));
        ensure_dir(&dir).unwrap();
        let p = dir.join(name_of("", "configmaps"));
        write_atomic(&p, b"one", None).unwrap();
        let proven_at = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        write_atomic(&p, b"two", Some(proven_at)).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().modified().unwrap(), proven_at, "dated when proven");
        assert_eq!(fs::read(&p).unwrap(), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        }
        // A crash between the write and the rename leaves a temporary file: never read, removed
        // once older than a write could be (a young one may be another process's, going on).
        let long_ago = std::time::SystemTime::now() - LEFTOVER_AGE - std::time::Duration::from_secs(1);
        let secs = long_ago.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        // Begun long ago (its name says so), and one of the former names dated long ago.
        let old = dir.join(format!("core_configmaps.state.tmp-t{secs}-00000000000000ab"));
        let former = dir.join("core_configmaps.state.tmp-1-00000000000000ab");
        let (young, ahead) = (temporary(&p), temporary(&p));
        assert_ne!(ahead, young, "a new name each time");
        for f in [&old, &former, &young, &ahead] {
            fs::write(f, b"half").unwrap();
        }
        File::options().write(true).open(&former).unwrap().set_modified(long_ago).unwrap();
        // A write going on whose file is already dated as old as its state: left too.
        File::options().write(true).open(&young).unwrap().set_modified(long_ago).unwrap();
        // Another host's clock ahead (a shared volume): a write going on, left.
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(60);
        File::options().write(true).open(&ahead).unwrap().set_modified(later).unwrap();
        let all = open_all(&dir).unwrap();
        assert!(
            !old.exists() && !former.exists() && young.exists(),
            "the old ones removed, the young one left"
        );
        assert!(ahead.exists(), "one from the future left");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].0, "core_configmaps.state");
        assert_eq!(resource_of(&all[0].0), Some(("", "configmaps")));
        assert_eq!(resource_of(&name_of("apps", "deployments")), Some(("apps", "deployments")));
        assert_eq!(resource_of("x.state"), None);
        assert_eq!(resource_of("apps_a_b.state"), None);
        assert_eq!(resource_of("core_configmaps.state.tmp-1"), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A state file is read only if it is the proxy's own and only the proxy (or a group it is
    /// in) may write it.
    #[test]
    fn only_the_proxys_own_files_are_trusted() {
        let mine = [1000, 2000];
        assert_eq!(untrusted_by((1000, 1000, 0o100600), 1000, &mine), None);
        assert_eq!(untrusted_by((1000, 1000, 0o100644), 1000, &mine), None);
        assert_eq!(untrusted_by((1000, 2000, 0o100660), 1000, &mine), None, "an fsGroup's file");
        assert!(untrusted_by((1001, 1000, 0o100600), 1000, &mine).unwrap().contains("owned by uid 1001"));
        assert!(untrusted_by((0, 0, 0o100600), 1000, &mine).is_some(), "root's file is not the proxy's");
        assert!(untrusted_by((1000, 3000, 0o100620), 1000, &mine).unwrap().contains("group 3000"));
        assert!(untrusted_by((1000, 1000, 0o100602), 1000, &mine).unwrap().contains("mode 602"));
    }

    /// A file written 0600 is trusted; one made writable by others is not, nor a FIFO or a
    /// symbolic link in a file's place (opened without blocking or following it).
    #[cfg(unix)]
    #[test]
    fn open_files_fifos_and_links_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("kwc-state-mode-{}", fastrand::u64(..)));
        ensure_dir(&dir).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o700);
        let p = dir.join(name_of("", "configmaps"));
        write_atomic(&p, b"one", None).unwrap();
        let (_, opened) = open_all(&dir).unwrap().pop().unwrap();
        assert_eq!(untrusted(&opened.unwrap().1), None);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o666)).unwrap();
        let (_, opened) = open_all(&dir).unwrap().pop().unwrap();
        assert!(untrusted(&opened.unwrap().1).is_some_and(|why| why.contains("mode 666")));
        fs::remove_file(&p).unwrap();
        let fifo = std::process::Command::new("mkfifo").arg(&p).status();
        assert!(fifo.is_ok_and(|s| s.success()), "mkfifo (coreutils) makes the FIFO");
        let (_, opened) = open_all(&dir).unwrap().pop().unwrap();
        assert_eq!(untrusted(&opened.unwrap().1).as_deref(), Some("not a regular file"));
        fs::remove_file(&p).unwrap();
        let elsewhere = dir.join("elsewhere");
        write_atomic(&elsewhere, b"two", None).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &p).unwrap();
        let (_, opened) = open_all(&dir).unwrap().pop().unwrap();
        assert!(opened.is_err(), "a link is not followed");
        fs::remove_dir_all(&dir).unwrap();
    }
}
