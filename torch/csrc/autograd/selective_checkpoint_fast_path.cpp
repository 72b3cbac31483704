// Selective checkpointing for list policies below autograd, without Python:
// see selective_checkpoint_fast_path.h.
