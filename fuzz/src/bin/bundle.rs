fn main() {
    afl::fuzz!(|data: &[u8]| haptic_agent::fuzzing::bundle(data));
}
