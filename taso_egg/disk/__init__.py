"""What is kept on disk: outputs written all or nothing, derived data cached across processes."""
