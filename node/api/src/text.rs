//! The text forms a person types for a rent, read alike by `gpux` and the web console:
//! durations (`90`, `30m`, `2h`) and sizes (`20GiB`).

/// A duration: whole seconds, or a duration like `30m` or `2h`; more than zero.
///
/// ```
/// assert_eq!(gpux_api::text::duration_s("2h"), Ok(7200));
/// assert_eq!(gpux_api::text::duration_s("90"), Ok(90));
/// assert!(gpux_api::text::duration_s("0s").is_err());
/// ```
pub fn duration_s(text: &str) -> Result<u32, String> {
    let text = text.trim();
    let secs = match text.parse::<u64>() {
        Ok(s) => s,
        Err(_) => humantime::parse_duration(text)
            .map_err(|_| format!("'{text}': use seconds or a duration like 30m or 2h"))?
            .as_secs(),
    };
    if secs == 0 {
        return Err("must be more than zero".into());
    }
    u32::try_from(secs).map_err(|_| format!("'{text}' is too long"))
}

/// A size in bytes: `20GiB`, `512MiB`, `1TB` or plain bytes.
///
/// ```
/// assert_eq!(gpux_api::text::size_bytes("2KiB"), Ok(2048));
/// assert!(gpux_api::text::size_bytes("lots").is_err());
/// ```
pub fn size_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    text.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|e| format!("'{text}': {e} (e.g. 10GiB)"))
}
