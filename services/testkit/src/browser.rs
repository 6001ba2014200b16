//! Headless Chromium for the live map tests: one-shot runs (`--screenshot`, `--dump-dom`)
//! and a live page driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
//! JSON messages separated by NUL bytes on fds 3 and 4, so no port and no WebSocket).
//!
//! Chromium runs with no network services of its own (no sync, no component updates, no
//! background networking, no QUIC), a fresh profile in a temp dir, in its own process
//! group. Every wait has a deadline: a hung Chromium fails the test, and its whole group
//! (browser, renderers, zygotes) is SIGKILLed by its group id, never by name.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use base64::Engine as _;
use serde_json::{json, Value};

use crate::elastic::die_with_parent;
use crate::process::{process_alive, signal_group};
use crate::wait::{deadline, wait_until};

/// Debian's Chromium (`apt-get install chromium`; `deploy/install-deps.sh` does it).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// How long one run, or one DevTools command, may take before Chromium is taken for hung.
const CHROMIUM_WITHIN: Duration = Duration::from_secs(60);
/// How much of Chromium's log a failure prints.
const LOG_TAIL_BYTES: usize = 4000;

static NEXT_PROFILE: AtomicU64 = AtomicU64::new(1);

/// Whether Chromium is installed where the tests look for it.
pub fn chromium_installed() -> bool {
    Path::new(CHROMIUM).exists()
}

/// A fresh, empty profile directory, removed when dropped.
struct Profile(PathBuf);

impl Profile {
    fn new() -> anyhow::Result<Profile> {
        let n = NEXT_PROFILE.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "meridian-chromium-{}-{n}-{}",
            std::process::id(),
            nanos()
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Profile(dir))
    }

    fn log(&self) -> PathBuf {
        self.0.join("chromium.log")
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let from = text.len().saturating_sub(LOG_TAIL_BYTES);
        let from = (from..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(0);
        text[from..].to_string()
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn nanos() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// Chromium with the flags every run uses, in its own process group, logging to the
/// profile dir.
fn chromium(profile: &Profile, window: (u32, u32)) -> anyhow::Result<Command> {
    let log = File::create(profile.log())?;
    let mut command = Command::new(CHROMIUM);
    command
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"])
        .args(["--disable-background-networking", "--disable-component-update", "--disable-sync"])
        .args(["--disable-extensions", "--disable-default-apps", "--mute-audio"])
        .arg("--hide-scrollbars")
        .arg("--force-device-scale-factor=1")
        .arg(format!("--window-size={},{}", window.0, window.1))
        .arg(format!("--user-data-dir={}", profile.0.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    // A test killed outright takes its browser with it.
    die_with_parent(&mut command);
    Ok(command)
}

/// Waits for `child` to exit within `within`; on time out, or once it has exited, SIGKILLs
/// what is left of its process group (by the group id, its pid, before it is reaped so the
/// id cannot have been reused) and reaps it.
fn finish(
    child: &mut Child,
    within: Duration,
    what: &str,
) -> anyhow::Result<std::process::ExitStatus> {
    let pid = child.id() as i32;
    let waited = wait_until(deadline(within), what, || !process_alive(pid));
    let _ = signal_group(pid, libc::SIGKILL);
    let status = child.wait().context("reaping chromium")?;
    waited.map(|()| status)
}

/// Runs Chromium once on `url` with `extra` arguments (e.g. `--screenshot=PATH`) and a
/// virtual time budget for the page's scripts; fails if it runs past the deadline or exits
/// non-zero. Returns what it printed on stdout and stderr.
fn run_once(
    url: &str,
    window: (u32, u32),
    budget: Duration,
    extra: &[String],
) -> anyhow::Result<String> {
    let profile = Profile::new()?;
    let mut command = chromium(&profile, window)?;
    command.arg(format!("--virtual-time-budget={}", budget.as_millis())).args(extra).arg(url);
    let mut child = command.spawn().with_context(|| format!("starting {CHROMIUM}"))?;
    let status = finish(&mut child, CHROMIUM_WITHIN, &format!("chromium {extra:?} {url} to exit"))
        .with_context(|| format!("chromium hung; its log:\n{}", profile.log_tail()))?;
    let output = std::fs::read_to_string(profile.log()).unwrap_or_default();
    if !status.success() {
        bail!("chromium {extra:?} {url} exited with {status}; its log:\n{}", profile.log_tail());
    }
    Ok(output)
}

/// `chromium --headless --screenshot` of `url` in a `window`-sized viewport, after the
/// page's scripts had `budget` of virtual time; the PNG bytes.
pub fn screenshot_once(url: &str, window: (u32, u32), budget: Duration) -> anyhow::Result<Vec<u8>> {
    let profile = Profile::new()?;
    let path = profile.0.join("screenshot.png");
    run_once(url, window, budget, &[format!("--screenshot={}", path.display())])?;
    std::fs::read(&path)
        .with_context(|| format!("chromium wrote no screenshot to {}", path.display()))
}

/// `chromium --headless --dump-dom` of `url` after `budget` of virtual time: the DOM as
/// the page's scripts left it, serialised.
pub fn dump_dom_once(url: &str, budget: Duration) -> anyhow::Result<String> {
    let profile = Profile::new()?;
    let out_path = profile.0.join("dom.html");
    let out = File::create(&out_path)?;
    let mut command = chromium(&profile, (1280, 900))?;
    command
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .stdout(out);
    let mut child = command.spawn().with_context(|| format!("starting {CHROMIUM}"))?;
    let status = finish(&mut child, CHROMIUM_WITHIN, &format!("chromium --dump-dom {url} to exit"))
        .with_context(|| format!("chromium hung; its log:\n{}", profile.log_tail()))?;
    if !status.success() {
        bail!("chromium --dump-dom {url} exited with {status}; its log:\n{}", profile.log_tail());
    }
    std::fs::read_to_string(&out_path).context("reading the dumped DOM")
}

/// A page kept open in headless Chromium and driven over the DevTools protocol: evaluate
/// script in it and take screenshots while it keeps polling and redrawing on its own.
pub struct Browser {
    child: Option<Child>,
    to_chromium: File,
    from_chromium: mpsc::Receiver<Value>,
    session: String,
    next_id: u64,
    profile: Profile,
}

impl Browser {
    /// Starts Chromium on `url` with a `window`-sized viewport and attaches to its page.
    pub fn open(url: &str, window: (u32, u32)) -> anyhow::Result<Browser> {
        let profile = Profile::new()?;
        // Chromium reads commands from fd 3 and writes answers and events to fd 4.
        let (commands_read, commands_write) = pipe()?;
        let (answers_read, answers_write) = pipe()?;
        let mut command = chromium(&profile, window)?;
        command.arg("--remote-debugging-pipe").arg(url);
        let (commands_fd, answers_fd) = (commands_read.as_raw_fd(), answers_write.as_raw_fd());
        // SAFETY: between fork and exec this only calls fcntl and dup2, which are
        // async-signal-safe and touch no memory shared with the parent.
        unsafe {
            command.pre_exec(move || {
                // Move both ends above 4 first, so placing one on 3 or 4 cannot close the other.
                let commands = libc::fcntl(commands_fd, libc::F_DUPFD, 10);
                let answers = libc::fcntl(answers_fd, libc::F_DUPFD, 10);
                if commands < 0
                    || answers < 0
                    || libc::dup2(commands, 3) < 0
                    || libc::dup2(answers, 4) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().with_context(|| format!("starting {CHROMIUM}"))?;
        drop(commands_read);
        drop(answers_write);
        let (sender, from_chromium) = mpsc::channel();
        let reader = BufReader::new(File::from(answers_read));
        std::thread::spawn(move || {
            for message in reader.split(0) {
                let Ok(message) = message else { return };
                match serde_json::from_slice::<Value>(&message) {
                    Ok(value) => {
                        if sender.send(value).is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        });
        let mut browser = Browser {
            child: Some(child),
            to_chromium: File::from(commands_write),
            from_chromium,
            session: String::new(),
            next_id: 1,
            profile,
        };
        browser.session = browser.attach(url).context("attaching to the page")?;
        // The window includes space the viewport does not get: fix the viewport itself, so
        // screenshots are exactly `window` (as the one-shot `--screenshot` ones are).
        let session = browser.session.clone();
        let metrics = json!({
            "width": window.0, "height": window.1, "deviceScaleFactor": 1, "mobile": false
        });
        browser.call(Some(&session), "Emulation.setDeviceMetricsOverride", metrics)?;
        Ok(browser)
    }

    fn attach(&mut self, url: &str) -> anyhow::Result<String> {
        let mut target = None;
        wait_until(
            deadline(CHROMIUM_WITHIN),
            &format!("chromium to open a page on {url}"),
            || {
                let Ok(targets) = self.call(None, "Target.getTargets", json!({})) else {
                    return false;
                };
                target = targets["targetInfos"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|t| t["type"] == "page")
                    .and_then(|t| t["targetId"].as_str().map(str::to_string));
                target.is_some()
            },
        )?;
        let target = target.expect("invariant: set when the wait succeeded");
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target, "flatten": true }),
        )?;
        attached["sessionId"].as_str().map(str::to_string).context("no sessionId")
    }

    /// Sends one DevTools command and waits for its answer (events in between are skipped).
    fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> anyhow::Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message)?;
        bytes.push(0);
        self.to_chromium.write_all(&bytes).with_context(|| format!("sending {method}"))?;
        let until = Instant::now() + CHROMIUM_WITHIN;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let answer = match self.from_chromium.recv_timeout(left) {
                Ok(answer) => answer,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    bail!("chromium did not answer {method} within {CHROMIUM_WITHIN:?}")
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    bail!(
                        "chromium closed its DevTools pipe; its log:\n{}",
                        self.profile.log_tail()
                    )
                }
            };
            if answer["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(error) = answer.get("error") {
                bail!("{method} failed: {error}");
            }
            return Ok(answer["result"].clone());
        }
    }

    /// Evaluates `expression` in the page and returns its value (promises are awaited).
    pub fn evaluate(&mut self, expression: &str) -> anyhow::Result<Value> {
        let session = self.session.clone();
        let params =
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
        let result = self.call(Some(&session), "Runtime.evaluate", params)?;
        if let Some(exception) = result.get("exceptionDetails") {
            bail!("evaluating {expression:?} threw: {exception}");
        }
        Ok(result["result"]["value"].clone())
    }

    /// A left click at `(x, y)` in CSS pixels of the viewport, as a mouse makes it (press,
    /// release: the page gets `mousedown`, `mouseup` and `click` on what is there).
    pub fn click(&mut self, x: f64, y: f64) -> anyhow::Result<()> {
        let session = self.session.clone();
        for (kind, buttons) in [("mousePressed", 1), ("mouseReleased", 0)] {
            let params = json!({
                "type": kind, "x": x, "y": y, "button": "left", "buttons": buttons, "clickCount": 1
            });
            self.call(Some(&session), "Input.dispatchMouseEvent", params)?;
        }
        Ok(())
    }

    /// A key pressed and released, as a keyboard sends it to the focused element: `key` is
    /// a `KeyboardEvent.key` (`"e"`, `" "`, `"ArrowUp"`, `"Enter"`); a one-character key
    /// also types its character.
    pub fn key(&mut self, key: &str) -> anyhow::Result<()> {
        let session = self.session.clone();
        let mut down = json!({ "type": "rawKeyDown", "key": key });
        if key.chars().count() == 1 {
            down = json!({ "type": "keyDown", "key": key, "text": key });
        }
        self.call(Some(&session), "Input.dispatchKeyEvent", down)?;
        self.call(
            Some(&session),
            "Input.dispatchKeyEvent",
            json!({ "type": "keyUp", "key": key }),
        )?;
        Ok(())
    }

    /// A PNG of the viewport as it is now.
    pub fn screenshot(&mut self) -> anyhow::Result<Vec<u8>> {
        let session = self.session.clone();
        let result =
            self.call(Some(&session), "Page.captureScreenshot", json!({ "format": "png" }))?;
        let data = result["data"].as_str().context("no screenshot data")?;
        base64::engine::general_purpose::STANDARD.decode(data).context("screenshot is not base64")
    }

    /// The last lines of Chromium's log.
    pub fn log_tail(&self) -> String {
        self.profile.log_tail()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as i32;
            let _ = signal_group(pid, libc::SIGKILL);
            let _ = child.wait();
        }
    }
}

/// A pipe whose ends are closed on exec (the child gets copies on 3 and 4 only).
fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array we pass and nothing else.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe2");
    }
    // SAFETY: both descriptors were just created by pipe2 and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hung_run_fails_and_its_whole_group_is_killed() {
        // A stand-in for a hung Chromium: a shell that never exits, with a child of its own.
        let mut child = Command::new("sh")
            .args(["-c", "sleep 300 & sleep 300"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let started = Instant::now();
        let error = finish(&mut child, Duration::from_millis(300), "the stand-in to exit")
            .unwrap_err()
            .to_string();
        assert!(error.contains("waiting for the stand-in to exit"), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // Nothing of the group is left: signalling it finds no process.
        wait_until(deadline(Duration::from_secs(5)), "the group to be gone", || {
            // SAFETY: kill(2) with signal 0 only checks that the group exists.
            unsafe { libc::kill(-pid, 0) != 0 }
        })
        .unwrap();
    }
}
