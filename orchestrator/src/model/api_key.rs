//! A provider's API key: from the configuration, or from a file (a mounted
//! Secret) that is read again whenever it changes, so that a rotated
//! Secret takes effect on the next request, without a restart.
//!
//! Kubernetes updates a mounted Secret by pointing a symbolic link at a
//! new directory; the file's metadata, taken through the link, changes
//! with it. One `stat` per request tells (a microsecond, next to a model
//! request of hundreds of milliseconds); the file is read only when its
//! metadata changed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use reqwest::header::{HeaderName, HeaderValue};

/// The key of one provider, and the header that carries it.
pub(crate) struct ApiKey {
    header: HeaderName,
    /// Sent as `Bearer <key>` (OpenAI) rather than alone (Anthropic).
    bearer: bool,
    source: Source,
}

enum Source {
    Fixed(Loaded),
    File {
        section: &'static str,
        path: PathBuf,
        state: Mutex<FileState>,
    },
}

/// A key as sent, and as cut out of error texts that echo it.
#[derive(Clone)]
pub(crate) struct Loaded {
    pub(crate) header: HeaderValue,
    pub(crate) key: Arc<str>,
}

struct FileState {
    /// The metadata of the file the key was read from.
    read_at: Stamp,
    loaded: Loaded,
    /// The metadata of a change that could not be read (`Some(None)`: the
    /// file could not be looked at), so that it is tried and said once.
    failed_at: Option<Option<Stamp>>,
}

/// What tells one version of the file from another.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl Stamp {
    fn of(path: &Path) -> std::io::Result<Self> {
        let metadata = std::fs::metadata(path)?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
        #[cfg(not(unix))]
        let inode = 0;
        Ok(Self {
            modified: metadata.modified().ok(),
            len: metadata.len(),
            inode,
        })
    }
}

impl ApiKey {
    /// The key of `section` (`openai`, `anthropic`), sent in `header`:
    /// the content of `file` (its trailing newline dropped) when set, else
    /// `key`; `None` when neither is.
    ///
    /// # Errors
    ///
    /// Both are set, the file cannot be read or is empty, or the key is
    /// not a header value; the error names the key and the file, never
    /// the content.
    pub(crate) fn new(
        section: &'static str,
        header: &'static str,
        bearer: bool,
        key: Option<&str>,
        file: Option<&Path>,
    ) -> Result<Option<Self>, String> {
        let header = HeaderName::from_static(header);
        let source = match (file, key.filter(|key| !key.is_empty())) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{section}.api_key and {section}.api_key_file are both set; keep one"
                ));
            }
            (None, None) => return Ok(None),
            (None, Some(key)) => Source::Fixed(loaded(section, key, bearer)?),
            (Some(path), None) => {
                let (read_at, key) = read(section, path)?;
                Source::File {
                    section,
                    path: path.to_owned(),
                    state: Mutex::new(FileState {
                        read_at,
                        loaded: loaded(section, &key, bearer)?,
                        failed_at: None,
                    }),
                }
            }
        };
        Ok(Some(Self {
            header,
            bearer,
            source,
        }))
    }

    /// The header that carries the key.
    pub(crate) fn header(&self) -> &HeaderName {
        &self.header
    }

    /// The key to send now: a file's, read again if it changed since. A
    /// change that cannot be read (the file is gone, empty, or written
    /// while it was read) keeps the last key, with a warning once per
    /// change; a half-written file is read again once its writer is done.
    pub(crate) fn current(&self) -> Loaded {
        let (section, path, state) = match &self.source {
            Source::Fixed(loaded) => return loaded.clone(),
            Source::File {
                section,
                path,
                state,
            } => (*section, path, state),
        };
        let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
        // `None`: the file cannot be looked at (gone, say).
        let stamp = Stamp::of(path).ok();
        if stamp == Some(state.read_at) || state.failed_at == Some(stamp) {
            return state.loaded.clone();
        }
        let reloaded = read(section, path)
            .and_then(|(read_at, key)| Ok((read_at, loaded(section, &key, self.bearer)?)));
        match reloaded {
            Ok((read_at, loaded)) => {
                tracing::info!(file = %path.display(), "{section}.api_key_file changed: using its new key");
                *state = FileState {
                    read_at,
                    loaded,
                    failed_at: None,
                };
            }
            Err(problem) => {
                tracing::warn!("{problem}; keeping the key read before");
                state.failed_at = Some(stamp);
            }
        }
        state.loaded.clone()
    }
}

/// The key of `section` in `file`, and the file's metadata as it was read.
fn read(section: &str, file: &Path) -> Result<(Stamp, String), String> {
    let cannot = |err: std::io::Error| {
        format!(
            "{section}.api_key_file: cannot read {}: {err}",
            file.display()
        )
    };
    let before = Stamp::of(file).map_err(cannot)?;
    let text = std::fs::read_to_string(file).map_err(cannot)?;
    // Written meanwhile (edited in place, not swapped): maybe half a key.
    if Stamp::of(file).ok() != Some(before) {
        return Err(format!(
            "{section}.api_key_file: {} changed while it was read",
            file.display()
        ));
    }
    let key = text.trim_end_matches(['\n', '\r']);
    if key.is_empty() {
        return Err(format!(
            "{section}.api_key_file: {} is empty",
            file.display()
        ));
    }
    Ok((before, key.to_owned()))
}

fn loaded(section: &str, key: &str, bearer: bool) -> Result<Loaded, String> {
    let text = if bearer {
        format!("Bearer {key}")
    } else {
        key.to_owned()
    };
    let mut header = HeaderValue::from_str(&text)
        .map_err(|_| format!("{section}: the API key is not a header value"))?;
    // Never printed, by reqwest or hyper.
    header.set_sensitive(true);
    Ok(Loaded {
        header,
        key: key.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(key: &ApiKey) -> String {
        key.current().header.to_str().unwrap().to_owned()
    }

    /// Writes `text` to `file` with a modification time of its own (a
    /// rewrite within the file system's clock tick would keep the old).
    fn write(file: &Path, text: &str, second: u64) {
        std::fs::write(file, text).unwrap();
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000 + second);
        std::fs::File::options()
            .write(true)
            .open(file)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }

    #[test]
    fn a_key_comes_from_its_file_or_the_configuration_never_both() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        write(&file, "sk-from-file\n", 0);
        let from_file = ApiKey::new("openai", "authorization", true, None, Some(&file));
        assert_eq!(sent(&from_file.unwrap().unwrap()), "Bearer sk-from-file");
        let plain = ApiKey::new("anthropic", "x-api-key", false, Some("sk-env"), None);
        let plain = plain.unwrap().unwrap();
        assert_eq!(
            (plain.header().as_str(), sent(&plain).as_str()),
            ("x-api-key", "sk-env")
        );
        assert!(plain.current().header.is_sensitive());
        assert_eq!(&*plain.current().key, "sk-env");
        assert!(
            ApiKey::new("openai", "authorization", true, Some(""), None)
                .unwrap()
                .is_none()
        );
        let error = |key, file: &Path| {
            ApiKey::new("anthropic", "x-api-key", false, key, Some(file))
                .err()
                .unwrap()
        };
        let both = error(Some("sk-env"), &file);
        assert!(
            both.contains("anthropic.api_key_file") && !both.contains("sk-"),
            "{both}"
        );
        write(&file, "\n", 1);
        assert!(error(None, &file).contains("is empty"));
        let missing = error(None, &dir.path().join("nope"));
        assert!(
            missing.contains("cannot read") && missing.contains("nope"),
            "{missing}"
        );
        write(&file, "sk-bad\nline", 2);
        let bad = error(None, &file);
        assert!(
            bad.contains("not a header value") && !bad.contains("sk-"),
            "{bad}"
        );
    }

    /// A rewritten key file is read at the next request; a change that
    /// cannot be read keeps the last key until a readable one comes.
    #[test]
    fn a_rotated_key_file_is_read_again_and_a_broken_one_keeps_the_last_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        write(&file, "sk-one\n", 0);
        let key = ApiKey::new("anthropic", "x-api-key", false, None, Some(&file))
            .unwrap()
            .unwrap();
        assert_eq!(sent(&key), "sk-one");
        write(&file, "sk-two\n", 1);
        assert_eq!(sent(&key), "sk-two");
        write(&file, "\n", 2);
        assert_eq!(sent(&key), "sk-two", "empty: the last key stays");
        std::fs::remove_file(&file).unwrap();
        assert_eq!(sent(&key), "sk-two", "gone: the last key stays");
        write(&file, "sk-three", 3);
        assert_eq!(sent(&key), "sk-three");
    }

    /// How Kubernetes updates a mounted Secret: the file is a link into a
    /// directory that a link swap replaces.
    #[cfg(unix)]
    #[test]
    fn a_secret_swapped_as_kubernetes_does_is_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("..2026_01"), dir.path().join("..2026_02"));
        for (version, key) in [(&old, "sk-old"), (&new, "sk-new")] {
            std::fs::create_dir(version).unwrap();
            write(&version.join("api-key"), key, 0);
        }
        let data = dir.path().join("..data");
        std::os::unix::fs::symlink(&old, &data).unwrap();
        let file = dir.path().join("api-key");
        std::os::unix::fs::symlink(data.join("api-key"), &file).unwrap();
        let key = ApiKey::new("openai", "authorization", true, None, Some(&file))
            .unwrap()
            .unwrap();
        assert_eq!(sent(&key), "Bearer sk-old");
        // Same contents' length and time: the swap is told by the inode.
        let swap = dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&new, &swap).unwrap();
        std::fs::rename(&swap, &data).unwrap();
        assert_eq!(sent(&key), "Bearer sk-new");
    }
}
