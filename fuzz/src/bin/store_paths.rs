fn main() {
    afl::fuzz!(|data: &[u8]| haptic::fuzzing::store_paths(data));
}
