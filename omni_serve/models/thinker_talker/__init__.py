"""What the Thinker-Talker omni families (Qwen3-Omni, Qwen2.5-Omni) share: the messages their
stages send each other, and the interface each family gives the stage deployments."""
