//! A real browser for the console's tests: Debian's Chromium, headless,
//! driven by a scenario of `tests/console` (a Node script over
//! puppeteer-core) that clicks and types as a person would and says in
//! JSON what it saw, for the test to assert on.
//!
//! Each run has a fresh, empty profile (no cookies from another run) and
//! a deadline; its screenshots go to `<root>/<name>/`, where the root is
//! `TOOLFLEET_SCREENSHOTS` when it is set (a path relative to the
//! repository's root, or absolute: how docs/images/console is refreshed)
//! and `target/screenshots` otherwise. scripts/setup installs all of it:
//! `chromium` from Debian, puppeteer-core with `npm ci` in tests/console,
//! and the Node it runs on is tests/identity's (puppeteer-core needs a
//! newer one than Debian's). `TOOLFLEET_CHROMIUM` names another Chromium.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

use crate::repo_root;

/// The longest a scenario may run; the scripts give up before it
/// (tests/console/browser.mjs), so this only catches a hung Node.
const DEADLINE: Duration = Duration::from_secs(120);

/// Where scenarios write their screenshots; see the module's doc.
const SCREENSHOTS_ENV: &str = "TOOLFLEET_SCREENSHOTS";

/// Chromium, and the Node that drives it, for one test.
#[derive(Debug)]
pub struct Browser {
    chromium: PathBuf,
    node: PathBuf,
    screenshots: PathBuf,
}

impl Browser {
    /// Finds Chromium and the scenarios' Node; screenshots of this test's
    /// runs go to the directory `name`, created, or emptied of an earlier
    /// run's pictures.
    ///
    /// # Errors
    ///
    /// One of them is missing: the error says what scripts/setup installs.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let node = repo_root().join("tests/identity/node_modules/.bin/node");
        anyhow::ensure!(
            node.is_file(),
            "{} not found: run scripts/setup (npm ci in tests/identity)",
            node.display()
        );
        let puppeteer = console_tests().join("node_modules/puppeteer-core");
        anyhow::ensure!(
            puppeteer.is_dir(),
            "{} not found: run scripts/setup (npm ci in tests/console)",
            puppeteer.display()
        );
        let screenshots = screenshots_root().join(name);
        std::fs::create_dir_all(&screenshots)
            .with_context(|| format!("cannot create {}", screenshots.display()))?;
        // Only this run's: a `failure.png` of an earlier run would mislead.
        for entry in std::fs::read_dir(&screenshots)?.flatten() {
            if entry.path().extension().is_some_and(|ext| ext == "png") {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(Self {
            chromium: chromium()?,
            node,
            screenshots,
        })
    }

    /// Where this test's screenshots are.
    pub fn screenshots(&self) -> &Path {
        &self.screenshots
    }

    /// Runs `tests/console/<scenario>.mjs` with `input` and returns what it
    /// printed: one JSON document.
    ///
    /// # Errors
    ///
    /// The scenario failed (the error has its stderr: the step, the page's
    /// address and text; and a screenshot `failure.png`), ran past its
    /// deadline, or printed something else than JSON.
    pub async fn run(&self, scenario: &str, input: &Value) -> anyhow::Result<Value> {
        let script = console_tests().join(format!("{scenario}.mjs"));
        anyhow::ensure!(script.is_file(), "no scenario {}", script.display());
        let profile = tempfile::tempdir()?;
        let child = tokio::process::Command::new(&self.node)
            .arg(&script)
            .arg(input.to_string())
            .current_dir(console_tests())
            .env("TOOLFLEET_CHROMIUM", &self.chromium)
            .env("TOOLFLEET_BROWSER_PROFILE", profile.path())
            .env("TOOLFLEET_SCREENSHOT_DIR", &self.screenshots)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.node.display()))?;
        let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
            .await
            .with_context(|| format!("scenario {scenario} ran past {DEADLINE:?}"))??;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        anyhow::ensure!(
            output.status.success(),
            "scenario {scenario} failed ({}); screenshots in {}:\n{stderr}{stdout}",
            output.status,
            self.screenshots.display()
        );
        if !stderr.trim().is_empty() {
            eprintln!("scenario {scenario} said:\n{stderr}");
        }
        serde_json::from_str(&stdout)
            .with_context(|| format!("scenario {scenario} printed no JSON:\n{stdout}\n{stderr}"))
    }
}

fn console_tests() -> PathBuf {
    repo_root().join("tests/console")
}

/// `TOOLFLEET_CHROMIUM`, else `chromium` on the `PATH`.
fn chromium() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("TOOLFLEET_CHROMIUM") {
        let path = PathBuf::from(path);
        anyhow::ensure!(
            path.is_file(),
            "TOOLFLEET_CHROMIUM={} is not a file",
            path.display()
        );
        return Ok(path);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("chromium"))
        .find(|path| path.is_file())
        .context(
            "chromium not found: run scripts/setup (Debian's chromium), or set TOOLFLEET_CHROMIUM",
        )
}

/// `TOOLFLEET_SCREENSHOTS` (relative to the repository), else
/// `target/screenshots` beside the test's own executable.
fn screenshots_root() -> PathBuf {
    if let Some(root) = std::env::var_os(SCREENSHOTS_ENV) {
        return repo_root().join(root);
    }
    // Tests run from target/<profile>/deps.
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(std::env::temp_dir)
        .join("screenshots")
}
