fn main() {
    afl::fuzz!(|data: &[u8]| haptic::fuzzing::haproxy_cfg(data));
}
