"""kvq.planner"""
