//! User documents and code comments state current behaviour; development history ("the fourth
//! session", records named `...-session5.txt`, an issue cited by its number) belongs in `docs/lab/` or in
//! git history. This test fails when a file outside `docs/lab/` names a development session or
//! cites one of the project's issues by number.

use std::fs;
use std::path::{Path, PathBuf};

/// Extensions of the files checked: documentation and every kind of source with comments.
const CHECKED: &[&str] = &["md", "rs", "c", "cu", "py", "sh", "toml", "yaml", "yml"];
/// Folders not checked: history, build outputs, the GPU bundle and vendored trees.
const SKIPPED: &[&str] = &["docs/lab", "target", ".git", ".carry", "node_modules"];
const ORDINALS: &[&str] = &[
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh",
];

/// The places in `text` that name a development session: "<ordinal> session" or "session"
/// directly followed by a digit ("session6"). A systemd unit such as `session-3.scope` is not one.
fn session_mentions(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let word = "session";
    let mut found = Vec::new();
    for (at, _) in lower.match_indices(word) {
        let before = lower[..at].trim_end_matches(char::is_whitespace);
        let after = lower[at + word.len()..].chars().next();
        let ordinal = ORDINALS.iter().any(|o| {
            before.ends_with(o)
                && before.len() < at
                && !before[..before.len() - o.len()].ends_with(|c: char| c.is_ascii_alphanumeric())
        });
        if ordinal || after.is_some_and(|c| c.is_ascii_digit()) {
            let line = lower[..at].matches('\n').count() + 1;
            let start = at.saturating_sub(30);
            let end = (at + word.len() + 10).min(lower.len());
            let context = text.get(start..end).unwrap_or(word);
            found.push(format!("line {line}: ...{context}..."));
        }
    }
    found
}

/// The places in `text` that cite one of the project's issues: "issue" as a word, then blanks
/// and a digit. Other projects' issues are cited by their
/// repository (`HAMi#2863`), which this leaves alone, as it does "issues" ("rank r issues 5").
fn issue_mentions(text: &str) -> Vec<String> {
    let lower = text.to_ascii_lowercase();
    let word = "issue";
    let mut found = Vec::new();
    for (at, _) in lower.match_indices(word) {
        let starts_word = !lower[..at].ends_with(|c: char| c.is_ascii_alphanumeric());
        let rest = &lower[at + word.len()..];
        let blanks = rest.len() - rest.trim_start_matches([' ', '\t', '\n']).len();
        let digit = blanks > 0 && rest[blanks..].starts_with(|c: char| c.is_ascii_digit());
        if starts_word && digit {
            let line = lower[..at].matches('\n').count() + 1;
            let end = (at + word.len() + blanks + 6).min(lower.len());
            let context = text.get(at..end).unwrap_or(word);
            found.push(format!("line {line}: {context}..."));
        }
    }
    found
}

fn checked_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let relative = path.strip_prefix(root).unwrap_or(&path);
        if SKIPPED.iter().any(|s| relative.starts_with(s)) {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            checked_files(root, &path, out);
        } else if kind.is_file()
            && path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| CHECKED.contains(&e))
        {
            out.push(path);
        }
    }
}

// The samples are split so that this file does not itself read as a narrative.
#[test]
fn the_detector_finds_sessions_and_leaves_unit_names_alone() {
    assert_eq!(
        session_mentions(concat!("as the Fourth", " session showed")).len(),
        1
    );
    assert_eq!(
        session_mentions(concat!("see bench-h100-", "session6.json")).len(),
        1
    );
    assert_eq!(
        session_mentions(concat!("in the first ", " session")).len(),
        1
    );
    assert_eq!(
        session_mentions(concat!("the Sixth", "\nsession, above")).len(),
        1
    );
    assert!(session_mentions("/user.slice/session-3.scope").is_empty());
    assert!(session_mentions("the probe session attaches").is_empty());
    assert!(session_mentions("a tmux session").is_empty());
    assert!(session_mentions("the thirst session").is_empty());
}

// The samples are split so that this file does not itself cite an issue.
#[test]
fn the_detector_finds_issue_numbers_and_leaves_other_uses_alone() {
    assert_eq!(issue_mentions(concat!("(iss", "ue 4, point 8)")).len(), 1);
    assert_eq!(issue_mentions(concat!("see Iss", "ue\n22 for")).len(), 1);
    assert!(issue_mentions("HAMi#2863 and HAMi-core#274").is_empty());
    assert!(issue_mentions("rank r issues 5 calls").is_empty());
    assert!(issue_mentions(concat!("tiss", "ue 5")).is_empty());
    assert!(issue_mentions("an issue with 4 GPUs").is_empty());
}

#[test]
fn no_file_outside_docs_lab_names_a_development_session() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    checked_files(&root, &root, &mut files);
    assert!(
        files.len() > 50,
        "found only {} files under {}",
        files.len(),
        root.display()
    );
    let this_file = Path::new(file!()).file_name();
    let mut offenders = Vec::new();
    for path in files {
        if path.file_name() == this_file {
            continue;
        }
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        for mention in session_mentions(&text)
            .into_iter()
            .chain(issue_mentions(&text))
        {
            offenders.push(format!("{}: {mention}", path.display()));
        }
    }
    assert!(
        offenders.is_empty(),
        "development history belongs in docs/lab/ (say what is true now, and why):\n{}",
        offenders.join("\n")
    );
}
