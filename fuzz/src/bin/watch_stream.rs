fn main() {
    afl::fuzz!(|data: &[u8]| haptic::fuzzing::watch_stream(data));
}
