//! Byte-level BPE tokenization from GGUF metadata.

/// GPT-2's `bytes_to_unicode`: the printable character that stands for each byte in a
/// byte-level BPE vocabulary (printable Latin-1 bytes stand for themselves, the others are
/// moved to U+0100 and up in byte order).
pub fn byte_to_unicode() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        out[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("U+0100..U+0143 are valid chars")
        };
    }
    out
}
