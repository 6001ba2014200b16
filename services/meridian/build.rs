//! Names the git commit the binary is built from, for `meridian_build_info{commit}`:
//! `MERIDIAN_COMMIT` if set (the Docker build passes it: its context has no `.git`), else
//! `git rev-parse --short HEAD`, else `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=MERIDIAN_COMMIT");
    let from_env = std::env::var("MERIDIAN_COMMIT").ok().filter(|c| !c.trim().is_empty());
    let commit = from_env
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Built again when HEAD moves: HEAD itself (a checkout) and the branch it names (a commit).
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
    }
    if let (Some(common), Some(branch)) =
        (git(&["rev-parse", "--git-common-dir"]), git(&["symbolic-ref", "-q", "HEAD"]))
    {
        // A branch is a file of its own, or a line of packed-refs. (A path that does not
        // exist would run this script again on every build.)
        let loose = std::path::Path::new(&common).join(&branch);
        let packed = std::path::Path::new(&common).join("packed-refs");
        for path in [loose, packed].into_iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rustc-env=MERIDIAN_BUILD_COMMIT={commit}");
}
