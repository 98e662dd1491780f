"""What the Thinker-Talker omni families (Qwen3-Omni, Qwen2.5-Omni) share: the messages their
stages send each other, the interface each family gives the deployments (where a family's rule
differs, it is asked of the family), prompt building, the chat flow across the stages, the
Thinker's turns and the spoken-reply session."""
