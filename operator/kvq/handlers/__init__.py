"""kvq.handlers"""
