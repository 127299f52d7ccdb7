//! What may name a group (`GPUGUARD_GROUP`): a leaf, so that the settings can check
//! the name without depending on the group file's module.

/// The rule, for people.
pub const RULE: &str = "1 to 64 of A-Z a-z 0-9 . _ -, not starting with '.'";

/// Whether `name` may name a group: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting
/// with `.` (no `/`, no `..`: it becomes a file name).
pub fn valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}
