fn main() {
    afl::fuzz!(|data: &[u8]| haptic::fuzzing::duration(data));
}
